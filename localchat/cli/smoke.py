"""The ``smoke`` and ``parity`` commands (and ``serve --smoke``): check a server and compare it with
in-process, and show the result."""

from __future__ import annotations

import json
from dataclasses import asdict

from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table

from localchat.backends import DEFAULT_TIMEOUT_S
from localchat.backends.openai_http import backend_for
from localchat.cli import outcomes
from localchat.registry import DEMO_MODEL, ModelRef, resolve
from localchat.server.distributed import Ranks
from localchat.server.parity import ParityReport, run_parity
from localchat.server.shown import shown_log_on_failure
from localchat.server.smoke import SmokeReport, run_smoke


def show_smoke(console: Console, report: SmokeReport, as_json: bool) -> None:
    if as_json:
        console.print_json(json.dumps(report.as_dict()))
        return
    table = Table("check", "result", "time", Column("detail", overflow="fold"),
                  title=f"smoke: {report.base_url} ({report.model})")
    for c in report.checks:
        mark = "[green]pass[/green]" if c.ok else ("[red]FAIL[/red]" if c.required else "[yellow]fail[/yellow]")
        table.add_row(c.name, mark, f"{c.seconds:.2f}s", escape(c.detail))
    console.print(table)
    console.print("[green]all required checks passed[/green]" if report.ok else "[red]smoke test failed[/red]")


def run_smoke_cmd(*, base_url: str, model: str | None, api_key: str | None, timeout_s: float, as_json: bool,
                  console: Console, api: tuple[str, ...] | None = None) -> int:
    """One report for chat completions, or one for each API of a gateway (``--api anthropic,responses``)."""
    ref = resolve(model) if model else None
    reports = [smoke_api(base_url, ref, one, api_key=api_key, timeout_s=timeout_s) for one in api or (None,)]
    if as_json and len(reports) > 1:
        console.print_json(json.dumps([r.as_dict() for r in reports]))
    else:
        for report in reports:
            show_smoke(console, report, as_json)
    return outcomes.report_exit(all(r.ok for r in reports))


def picture_expected(ref: ModelRef | None) -> str | None:
    """What smoke expects a vision model to say of a red circle: the toy says just that (its card),
    any other model anything at all."""
    from localchat.vision.support import is_vision

    if ref is None or not is_vision(ref):
        return None
    return "a red circle" if ref.id == "demo-vision" else ""


def smoke_api(base_url: str, ref: ModelRef | None, api: str | None, *, api_key: str | None = None,
              timeout_s: float = DEFAULT_TIMEOUT_S) -> SmokeReport:
    """``smoke`` through chat completions, or through one of the gateway's APIs."""
    from localchat.backends.anthropic_http import AnthropicBackend
    from localchat.backends.responses_http import ResponsesBackend

    kind = {None: None, "anthropic": AnthropicBackend, "responses": ResponsesBackend}[api]
    backend = backend_for(base_url, ref, api_key=api_key, timeout_s=timeout_s, kind=kind)
    try:
        return run_smoke(backend, judge_recall=ref is not None and ref.id == DEMO_MODEL, api=api,
                         judge_tools=ref is not None and ref.id == "demo-tools",
                         picture=picture_expected(ref) if api is None else None)
    finally:
        backend.close()


def run_parity_cmd(*, model: str | None, as_json: bool, console: Console, ranks: Ranks | None = None) -> int:
    with console.status("parity …") as status, shown_log_on_failure(console):
        report = run_parity(model, on_status=status.update, ranks=ranks)
    show_parity(console, report, as_json)
    return outcomes.report_exit(report.ok)


def show_parity(console: Console, report: ParityReport, as_json: bool) -> None:
    if as_json:
        console.print_json(json.dumps(asdict(report) | {"ok": report.ok}))
        return
    table = Table("turn", "prompt tokens (inproc / server)", "in-process reply", "server reply",
                  title=f"parity at temperature 0: {report.model}")
    for t in report.turns:
        table.add_row(str(t["turn"]), f"{t['inproc_prompt_tokens']} / {t['server_prompt_tokens']}",
                      escape(repr(t["inproc_text"])), escape(repr(t["server_text"])))
    console.print(table)
    console.print("[green]identical prompts and greedy replies[/green]" if report.ok
                  else f"[red]first difference: {escape(report.first_difference or '')}[/red]")


def smoke_served(base_url: str, ref: ModelRef, apis: tuple[str, ...], api_key: str | None, console: Console) -> int:
    """``serve --smoke``: chat completions, and each API served beside it."""
    reports = [smoke_api(base_url, ref, api, api_key=api_key) for api in (None, *apis)]
    for report in reports:
        show_smoke(console, report, as_json=False)
    return outcomes.report_exit(all(r.ok for r in reports))
