"""``localchat load`` on the terminal: a live line of users, requests and errors, then the table.

Ctrl+C (or SIGTERM) stops every user, shows what was measured and writes it marked partial.
"""

from __future__ import annotations

import threading
from collections import Counter

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.status import Status
from rich.table import Table

from localchat.cli import outcomes
from localchat.cli.terminal import wrap_parts
from localchat.errors import TerminationRequested, raise_on_sigterm
from localchat.load.metrics import RequestRecord
from localchat.load.report import environment_line, load_table, repeated_lines, sweep_lines, write_outputs, write_plot
from localchat.load.run import Run
from localchat.load.server_side import scrape, server_side_lines
from localchat.load.sweep import LoadOptions, LoadResult, Target, check_options, make_plan, new_result, run_load
from localchat.wording import count


class LiveLine:
    """The status line while a run goes: its users and history setting, requests done, errors.
    Users report from their own threads."""

    def __init__(self, status: Status):
        self.status, self.lock = status, threading.Lock()
        self.run: Run | None = None
        self.done = self.errors = 0

    def start(self, run: Run) -> None:
        self.run, self.done, self.errors = run, 0, 0
        run.on_request = self.heard
        self._show("starting")

    def heard(self, record: RequestRecord) -> None:
        with self.lock:
            self.done += 1
            self.errors += not record.ok
            self._show(f"requests {self.done} · errors {self.errors}")

    def _show(self, what: str) -> None:
        run = self.run
        if run is None:
            return
        self.status.update(f"{count(run.users, 'user')} · history {'on' if run.history else 'off'} · {what}")


def show(result: LoadResult, console: Console) -> None:
    """The runs as a table when it fits the terminal, else one block a run, wrapped between
    figures: nothing is cut."""
    headers, rows = load_table(result)
    table = Table(title="localchat load", box=box.SIMPLE_HEAD)
    for i, header in enumerate(headers):
        table.add_column(header, no_wrap=True, justify="left" if i < 2 else "right")
    for row in rows:
        table.add_row(*row)
    if Measurement.get(console, console.options.update_width(10_000), table).maximum <= console.width:
        console.print(table)
    else:
        console.print("localchat load", style="italic")
        for row in rows:
            console.print(f"{row[0]} {'user' if row[0] == '1' else 'users'}, history {row[1]}", style="bold",
                          markup=False)
            console.print(wrap_parts([f"{h} {v}" for h, v in zip(headers[2:], row[2:])], console.width),
                          markup=False)
    for line in [*sweep_lines(result), *repeated_lines(result)]:  # prose: wrapped between words
        console.print(line, markup=False, highlight=False, soft_wrap=False)
    console.print(environment_line(result), style="dim", markup=False, highlight=False, soft_wrap=False)


def run_load_cmd(*, opts: LoadOptions, console: Console, err: Console) -> int:
    check_options(opts)
    plan = make_plan(opts)
    raise_on_sigterm()
    interrupted: KeyboardInterrupt | None = None
    with err.status("starting …") as status, Target(opts, on_status=status.update) as target:
        result = new_result(opts, target)
        before = scrape(target.base_url, opts.api_key)
        try:
            run_load(opts, result, target, plan, on_run=LiveLine(status).start)
        except KeyboardInterrupt as exc:  # TerminationRequested too
            interrupted, result.stopped = exc, True
        server_side = server_side_lines(before, scrape(target.base_url, opts.api_key) if before else None)
    return finish(result, opts, console, err, interrupted, server_side)


def finish(result: LoadResult, opts: LoadOptions, console: Console, err: Console,
           interrupted: KeyboardInterrupt | None, server_side: list[str] | None = None) -> int:
    if result.runs:
        show(result, console)
    for line in server_side or []:  # (the server's own figures, when it has /metrics)
        console.print(line, markup=False, highlight=False)
    if opts.out:
        for path in write_outputs(result, opts.out):
            err.print(f"wrote {path}{' (partial)' if result.partial else ''}", style="dim")
    if opts.plot and result.runs:
        write_plot(result, opts.plot)
        err.print(f"wrote {opts.plot}", style="dim")
    if interrupted is not None:
        signal = "SIGTERM" if isinstance(interrupted, TerminationRequested) else "Ctrl+C"
        err.print(f"[yellow]stopped by {signal}: the figures above are partial[/yellow]")
        return outcomes.TERMINATED if signal == "SIGTERM" else outcomes.INTERRUPTED
    return report_failures(result, err)


def report_failures(result: LoadResult, err: Console) -> int:
    records = [r for run in result.runs for r in run.records]
    failed = [r for r in records if not r.ok]
    if not failed:
        return outcomes.OK
    kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(Counter(r.error_kind for r in failed).items()))
    err.print(f"[red]error:[/red] {len(failed)} of {len(records)} requests failed ({kinds}); the first: "
              f"{escape(failed[0].error or failed[0].status)}")
    return outcomes.FAILED

