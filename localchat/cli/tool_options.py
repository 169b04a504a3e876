"""The tool options (--tools, --mcp, --approve-tools, timeouts, rounds) of chat, bench and load."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Optional

import typer

from localchat.cli.options import MAX_WAIT_S
from localchat.tools.settings import (
    DEFAULT_MAX_TOOL_ROUNDS,
    DEFAULT_MCP_TIMEOUT_S,
    DEFAULT_TOOL_TIMEOUT_S,
    ToolSettings,
)

ToolsOpt = Annotated[Optional[list[Path]], typer.Option(
    "--tools", metavar="FILE.py", help="Offer every public function of this Python file (type hints and a docstring; "
                                       "_name keeps a helper out) as a tool the model may call; repeatable.")]
ApproveToolsOpt = Annotated[
    bool,
    typer.Option(
        "--approve-tools",
        help="Run every tool call without asking (else a terminal asks; without one, calls are refused).",
    ),
]
UnattendedApproveOpt = Annotated[
    bool,
    typer.Option(
        "--approve-tools", help="Run every tool call without asking (required with --tools: nobody is asked here)."
    ),
]
McpOpt = Annotated[Optional[list[Path]], typer.Option(
    "--mcp", metavar="FILE", help="Offer the tools of the MCP servers this file configures ({\"mcpServers\": …}, as "
                                  "LM Studio, Claude Desktop and Cursor read it); repeatable.")]
McpOnlyOpt = Annotated[Optional[str], typer.Option(
    "--mcp-only", metavar="NAME,…", help="Start only these servers of the --mcp files.")]
McpTimeoutOpt = Annotated[Optional[float], typer.Option(
    callback=lambda v: check_tool_timeout(v), metavar="SECONDS",
    help=f"Give an MCP server this long to start and list its tools [default: {DEFAULT_MCP_TIMEOUT_S:g}].")]


def mcp_names(value: str | None) -> tuple[str, ...]:
    """``--mcp-only a,b``: the names, each once."""
    names = tuple(n.strip() for n in (value or "").split(",") if n.strip())
    if value is not None and not names:
        raise typer.BadParameter("give the names of servers, e.g. --mcp-only time,git", param_hint="--mcp-only")
    return tuple(dict.fromkeys(names))


def check_tool_timeout(value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and 0 < value <= MAX_WAIT_S):
        raise typer.BadParameter(f"must be a number of seconds > 0, at most {MAX_WAIT_S:.0f}")
    return value


ToolTimeoutOpt = Annotated[Optional[float], typer.Option(callback=check_tool_timeout, metavar="SECONDS", help=(
    f"Stop a tool call after this many seconds [default: {DEFAULT_TOOL_TIMEOUT_S:g}]."))]
MaxToolRoundsOpt = Annotated[Optional[int], typer.Option(min=1, max=100, metavar="N", help=(
    f"Rounds of tool calls a turn may take before it must answer [default: {DEFAULT_MAX_TOOL_ROUNDS}]."))]


def check_tool_flags(tools: bool, approve: bool, timeout_s: float | None, rounds: int | None = None,
                     mcp_timeout_s: float | None = None) -> None:
    """Tool settings without any tools are a usage error, not silently nothing."""
    given = [flag for flag, value in (("--approve-tools", approve), ("--tool-timeout", timeout_s is not None),
                                      ("--max-tool-rounds", rounds is not None),
                                      ("--mcp-timeout", mcp_timeout_s is not None)) if value]
    if given and not tools:
        from localchat.cli.dispatch import ClickUsageError

        raise ClickUsageError(f"{given[0]} goes with --tools FILE.py or --mcp FILE, and no tools are offered")


def tool_settings(*, files: list[Path] | None, mcp: list[Path] | None, mcp_only: str | None, approve: bool,
                  timeout_s: float | None, max_rounds: int | None = None,
                  mcp_timeout_s: float | None = None) -> ToolSettings:
    """The tool flags, checked together and resolved to their defaults."""
    check_tool_flags(bool(files or mcp), approve, timeout_s, max_rounds, mcp_timeout_s)
    if mcp_only is not None and not mcp:
        from localchat.cli.dispatch import ClickUsageError

        raise ClickUsageError("--mcp-only picks servers of --mcp FILE, and no --mcp file is given")
    return ToolSettings(files=tuple(files or ()), mcp=tuple(mcp or ()), mcp_only=mcp_names(mcp_only), approve=approve,
                        timeout_s=timeout_s or DEFAULT_TOOL_TIMEOUT_S, max_rounds=max_rounds or DEFAULT_MAX_TOOL_ROUNDS,
                        mcp_timeout_s=mcp_timeout_s or DEFAULT_MCP_TIMEOUT_S)
