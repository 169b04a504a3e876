"""A model's tool calls run: each checked, approved, run with a time limit, and answered.

Whatever happens to a call becomes its result, which goes back to the model: a call whose text
could not be read, an unknown tool, arguments that are not JSON or do not fit the tool's schema, a
call the user did not approve, an exception, a timeout. Only Ctrl+C (and SIGTERM) ends the round.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localchat.backends import ToolCall
from localchat.errors import LocalchatError, UsageError
from localchat.tools.host import ToolHost, ToolTimeout, tool_files

DEFAULT_MAX_ROUNDS = 8
Approve = Callable[[str, dict[str, Any]], "str | None"]  # (tool, arguments) → None: run it; else why not
REFUSED_UNASKED = ("refused: localchat had no terminal to ask for approval and was not started with --approve-tools; "
                   "answer without this tool")
REFUSED_BY_USER = "refused: the user did not approve this call"


@dataclass(frozen=True)
class ToolResult:
    call: ToolCall
    content: str  # what the model reads as the tool's result
    status: str  # "ok" | "error" (the tool raised) | "invalid" (the call itself) | "refused" | "timeout"
    seconds: float = 0.0  # time spent inside the tool (not model time)

    @property
    def arguments(self) -> dict[str, Any] | str:
        """The call's arguments as an object when they are one (templates render them so), else
        the model's text as it wrote it."""
        try:
            value = json.loads(self.call.arguments)
        except ValueError:
            return self.call.arguments
        return value if isinstance(value, dict) else self.call.arguments


@dataclass
class ToolRunner:
    host: ToolHost
    approve: Approve
    max_rounds: int = DEFAULT_MAX_ROUNDS

    @property
    def specs(self) -> list[dict[str, Any]]:
        return self.host.specs

    def names(self) -> list[str]:
        return [spec["function"]["name"] for spec in self.specs]

    def run(self, call: ToolCall) -> ToolResult:
        checked = self._checked(call)
        if isinstance(checked, ToolResult):
            return checked
        refusal = self.approve(call.name, checked)
        if refusal is not None:
            return ToolResult(call, refusal, "refused")
        started = time.perf_counter()
        try:
            done = self.host.call(call.name, checked)
        except LocalchatError as exc:  # the tool ran past its limit, or its process ended
            status = "timeout" if isinstance(exc, ToolTimeout) else "error"
            return ToolResult(call, f"error: {exc}", status, time.perf_counter() - started)
        return ToolResult(call, done["content"], "ok" if done["ok"] else "error", done["seconds"])

    def _checked(self, call: ToolCall) -> dict[str, Any] | ToolResult:
        """The call's arguments when they may be run; else the result saying why not."""
        import jsonschema

        def invalid(why: str) -> ToolResult:
            return ToolResult(call, f"error: {why}", "invalid")

        if call.problem:
            return invalid(f"the tool call could not be read ({call.problem})")
        spec = next((s["function"] for s in self.specs if s["function"]["name"] == call.name), None)
        if spec is None:
            return invalid(f"there is no tool named {call.name!r} (the tools are: {', '.join(self.names())})")
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError as exc:
            return invalid(f"the arguments are not valid JSON ({exc})")
        if not isinstance(arguments, dict):
            return invalid("the arguments must be a JSON object of the parameters")
        try:
            jsonschema.validate(arguments, spec["parameters"])
        except jsonschema.ValidationError as exc:
            where = "/".join(map(str, exc.absolute_path)) or "the arguments"
            return invalid(f"the arguments do not fit {call.name}'s parameters ({where}: {exc.message})")
        return arguments

    def close(self) -> None:
        self.host.close()


def refuse_unasked(_: str, __: dict[str, Any]) -> str | None:
    """Without a terminal to ask and without ``--approve-tools``, no call runs."""
    return REFUSED_UNASKED


def approve_all(_: str, __: dict[str, Any]) -> str | None:
    """``--approve-tools``: every call runs."""
    return None


def check_unattended(files: tuple[Path, ...], approve: bool) -> None:
    """The tools of a run nobody watches (bench, load), checked before anything loads: every call
    runs, so ``--approve-tools`` must say so, and the files must be Python files that can be read."""
    if files and not approve:
        raise UsageError("--tools in a run nobody watches needs --approve-tools (every call runs without asking)")
    tool_files(list(files))


def unattended_runner(files: tuple[Path, ...], approve: bool, timeout_s: float,
                      max_rounds: int = DEFAULT_MAX_ROUNDS) -> ToolRunner | None:
    """The tools of a run nobody watches, every call approved; None without tools."""
    check_unattended(files, approve)
    if not files:
        return None
    return ToolRunner(ToolHost(list(files), timeout_s), approve_all, max_rounds)
