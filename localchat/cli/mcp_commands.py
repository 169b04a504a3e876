"""``localchat mcp list`` and ``localchat mcp call``: an MCP server checked by hand before a model
ever sees it, through the same configuration, start-up, names, argument checks and result text as
a chat's tools (``mcp.hub``, ``tools.runner``)."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from localchat import bounded_json
from localchat.backends import ToolCall
from localchat.cli import outcomes
from localchat.errors import LocalchatError, UsageError
from localchat.mcp.config import read_configs
from localchat.mcp.tools import exposed_name
from localchat.tools.runner import ToolRunner, approve_all


def list_servers(*, files: list[Path], only: tuple[str, ...], timeout_s: float, console: Console,
                 err: Console) -> int:
    """Each server's state and the tools it offers, as the model would see them."""
    hub = _started(files, only, timeout_s, 30.0, err)
    try:
        for info in hub.servers():
            problem = f" — {info.problem}" if info.problem and info.state != "ready" else ""
            console.print(f"[bold]{escape(info.name)}[/bold]: {info.state} · {info.where}{escape(problem)}")
        for spec in (s["function"] for s in hub.specs):
            console.print(f"  {escape(spec['name'])}: {escape(spec.get('description', '')[:200])}")
            console.print(f"    {escape(json.dumps(spec['parameters'], ensure_ascii=False))}", style="dim")
        return outcomes.report_exit(all(info.state == "ready" for info in hub.servers()))
    finally:
        hub.close()


def call_tool(*, files: list[Path], server: str, tool: str, arguments: str, timeout_s: float, console: Console,
              err: Console) -> int:
    """One call of SERVER's TOOL with ARGUMENTS (a JSON object), checked against its schema as a
    model's call is; its result on stdout, exit 1 when the tool says it failed."""
    try:
        parsed = bounded_json.loads(arguments, strict=True)
    except ValueError as exc:
        raise UsageError(f"ARGUMENTS must be a JSON object, e.g. '{{\"a\": 1}}' ({exc})") from None
    if not isinstance(parsed, dict):
        raise UsageError(f"ARGUMENTS must be a JSON object, not {type(parsed).__name__}")
    known = [c.name for c in read_configs(tuple(files))] if files else []
    if files and server not in known:
        raise UsageError(f"server '{server}' is not in the --mcp files (they configure: {', '.join(known)})")
    hub = _started(files, (server,), 30.0, timeout_s, err)
    try:
        if any(info.state != "ready" for info in hub.servers()):
            raise LocalchatError(f"the call was not made: MCP server '{server}' did not start (said above)")
        name = exposed_name(server, tool)
        if name not in {s["function"]["name"] for s in hub.specs}:
            offered = ", ".join(s["function"]["name"] for s in hub.specs) or "none"
            raise UsageError(f"server '{server}' offers no tool '{tool}' (offered as: {offered})")
        result = ToolRunner([hub], approve_all).run(ToolCall("manual", name, json.dumps(parsed)))
        (console if result.status == "ok" else err).print(escape(result.content), markup=False, highlight=False)
        err.print(f"{result.status} · {result.seconds:.2f}s", style="dim")
        return outcomes.report_exit(result.status == "ok")
    finally:
        hub.close()


def _started(files: list[Path], only: tuple[str, ...], start_timeout_s: float, call_timeout_s: float,
             err: Console):
    from localchat.home import home_dir
    from localchat.mcp.hub import McpHub, prune_logs

    if not files:
        raise UsageError("give the servers' file: --mcp FILE")
    notes: list[str] = []
    configs = read_configs(tuple(files), only, notes=notes)
    for note in notes:
        err.print(escape(note), style="dim")
    logs = home_dir() / "logs"
    prune_logs(logs)
    with err.status("starting MCP servers …"):
        return McpHub(configs, start_timeout_s=start_timeout_s, call_timeout_s=call_timeout_s, logs_dir=logs,
                      on_notice=lambda line: err.print(escape(line), style="dim"))
