"""``localchat bench`` on the terminal: a progress bar while it runs, then the table or a format."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from localchat.bench.arms import BenchResult
from localchat.bench.report import (
    DEPTH_HEADERS,
    POLICY_HEADERS,
    comparison_lines,
    depth_lines,
    depth_rows,
    distance_table,
    environment_line,
    policy_rows,
    summary_table,
    to_csv,
    to_json,
    to_markdown,
    write_outputs,
    write_plot,
)
from localchat.bench.run import BenchOptions, prepare_bench, run_bench
from localchat.cli import outcomes
from localchat.cli.terminal import for_stream, wrap_parts


def _fits(table: Table, console: Console) -> bool:
    return Measurement.get(console, console.options.update_width(10_000), table).maximum <= console.width


def _table(title: str, headers: list[str], rows: list[list[str]]) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD)
    for i, header in enumerate(headers):
        table.add_column(header, no_wrap=True, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    return table


def _show(title: str, headers: list[str], rows: list[list[str]], console: Console) -> None:
    """A table when it fits the terminal, else one block a row of ``header value`` pairs, wrapped
    between pairs: no name or figure is ever cut."""
    table = _table(title, headers, rows)
    if _fits(table, console):
        console.print(table)
        return
    console.print(title, style="italic")
    for name, *cells in rows:
        console.print(name, style="bold", markup=False)
        console.print(wrap_parts([f"{h} {c}" for h, c in zip(headers[1:], cells)], console.width), markup=False)


def show_table(result: BenchResult, console: Console) -> None:
    """The summary, the history policies (when the run had some) and the comparisons; a depth
    sweep's table and fitted growth."""
    if result.depth:
        _show("localchat bench --depth", DEPTH_HEADERS, depth_rows(result), console)
        for line in depth_lines(result):
            console.print(line, markup=False, highlight=False, soft_wrap=False)
        console.print(environment_line(result), style="dim", markup=False, highlight=False, soft_wrap=False)
        return
    _show("localchat bench", *summary_table(result), console)
    policies = policy_rows(result)
    if policies:
        _show("history policies", POLICY_HEADERS, policies, console)
    if (distances := distance_table(result)) is not None:
        _show("recall by distance (correct/asked, 95 % interval)", *distances, console)
    for line in comparison_lines(result):  # prose: wrapped between words
        console.print(line, markup=False, highlight=False, soft_wrap=False)
    console.print(environment_line(result), style="dim", markup=False, highlight=False, soft_wrap=False)


def run_bench_cmd(*, options: dict[str, Any], console: Console, err: Console) -> int:
    """Results on ``console`` (stdout, so --format json/csv pipes); progress and notices on ``err``."""
    prepared = prepare_bench(BenchOptions(**options))
    opts = prepared.opts
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err, transient=True) as progress:
        task = progress.add_task("starting", total=None)
        result = run_bench(
            prepared, on_start=lambda total: progress.update(task, total=total),
            on_turn=lambda what: progress.update(task, advance=1, description=what),
            on_status=lambda what: progress.update(task, description=what))
    renderers = {"md": to_markdown, "json": to_json, "csv": to_csv}
    if opts.format == "table":
        show_table(result, console)
    else:
        text = renderers[opts.format](result).rstrip("\n") + "\n"
        console.file.write(for_stream(console.file)(text))  # data: exact through a pipe
    if opts.out:
        for path in write_outputs(result, opts.out):
            err.print(f"wrote {path}", style="dim")
    if opts.plot:
        write_plot(result, opts.plot)
        err.print(f"wrote {opts.plot}", style="dim")
    if (opts.think or opts.think_budget) and not any(t.reasoning_tokens for t in result.turns):
        flag = "--think-budget" if opts.think_budget else "--think"
        err.print(f"[yellow]no turn reasoned: {escape(prepared.ref.id)} seems to have no thinking mode, so "
                  f"{flag} changed nothing (try -m demo-think)[/yellow]")
    return report_failures(result, err)


def report_failures(result: BenchResult, err: Console) -> int:
    """A run whose turns failed (server errors, bad chunks) is shown, and then it is a failure."""
    failed = [t for t in result.turns if t.status == "error"]
    if not failed:
        return outcomes.OK
    err.print(f"[red]error:[/red] {len(failed)} of {len(result.turns)} turns failed; the first, in "
              f"{failed[0].arm} ({failed[0].script} turn {failed[0].turn}): {escape(failed[0].error or '?')}")
    return outcomes.FAILED


def run_compare(*, first, second, force: bool, as_json: bool, console: Console) -> int:
    """``bench compare A B``: the two runs side by side, B against A tested."""
    import json

    from localchat.bench.compare import compare_lines, compare_runs

    report = compare_runs(first, second, force)
    if as_json:
        console.print_json(json.dumps(report))
        return outcomes.OK
    for line in compare_lines(report):
        console.print(escape(line), highlight=False)
    return outcomes.OK
