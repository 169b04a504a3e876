"""A model's tool calls run: each checked, approved, run with a time limit, and answered.

Tools come from sources (``ToolSource``): the user's Python files (``host``), MCP servers
(``localchat.mcp``). Whatever happens to a call becomes its result, which goes back to the model: a
call whose text could not be read, an unknown tool, arguments that are not JSON or do not fit the
tool's schema, a call the user did not approve, an exception, a timeout. Only Ctrl+C (and
SIGTERM) ends the round.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from localchat import bounded_json
from localchat.backends import ToolCall
from localchat.bounded_schema import CHECK_BUDGET_S, CheckTimeout, Deadline, schema_errors
from localchat.errors import LocalchatError
from localchat.tools.host import ToolOutput, ToolTimeout
from localchat.tools.settings import DEFAULT_MAX_TOOL_ROUNDS
from localchat.wording import count

Approve = Callable[[str, dict[str, Any]], "str | None"]  # (tool, arguments) → None: run it; else why not
REFUSED_UNASKED = ("refused: localchat had no terminal to ask for approval and was not started with --approve-tools; "
                   "answer without this tool")
REFUSED_BY_USER = "refused: the user did not approve this call"


class ToolSource(Protocol):
    """Where tools come from: their entries (OpenAI ``tools``, names as the model sees them), and
    one call at a time."""

    name: str  # what /tools shows as the source: a file's name, an MCP server's

    @property
    def specs(self) -> list[dict[str, Any]]: ...

    def call(self, name: str, arguments: dict[str, Any]) -> ToolOutput: ...

    def origin(self, name: str) -> str:
        """Where the tool ``name`` comes from, for ``/tools``: a file, an MCP server."""
        ...

    def refresh(self) -> bool:
        """Read the tools again if the source said they changed; True when they did."""
        ...

    def close(self) -> None: ...

    # optional: ``preapproved(name) -> str | None``, why a tool runs without asking (an MCP file's autoApprove)


@dataclass(frozen=True)
class ToolResult:
    call: ToolCall
    content: str  # what the model reads as the tool's result
    status: str  # "ok" | "error" (the tool raised) | "invalid" (the call itself) | "refused" | "timeout"
    seconds: float = 0.0  # time spent inside the tool (not model time)
    printed: str = ""  # what the tool printed beside its result: the user's to see, not the model's

    @property
    def arguments(self) -> dict[str, Any] | str:
        """The call's arguments as an object when they are one (templates render them so), else
        the model's text as it wrote it."""
        try:
            value = bounded_json.loads(self.call.arguments)
        except ValueError:
            return self.call.arguments
        return value if isinstance(value, dict) and _encodable(value) else self.call.arguments


@dataclass
class ToolRunner:
    sources: list[ToolSource]
    approve: Approve
    max_rounds: int = DEFAULT_MAX_TOOL_ROUNDS
    on_notice: Callable[[str], None] = lambda _: None  # a call that ran without asking because its source said so
    secrets: tuple[str, ...] = ()  # cut out of every result before it is shown, stored or sent

    @property
    def specs(self) -> list[dict[str, Any]]:
        return [spec for source in self.sources for spec in source.specs]

    def names(self) -> list[str]:
        return [spec["function"]["name"] for spec in self.specs]

    def refresh(self) -> bool:
        """Whether any source's tools changed (then they are offered again before the next round)."""
        return any([source.refresh() for source in self.sources])

    def source_of(self, name: str) -> ToolSource | None:
        return next((s for s in self.sources if any(t["function"]["name"] == name for t in s.specs)), None)

    def approval(self, name: str) -> str:
        """How a call of ``name`` is allowed to run, in words (``/tools``)."""
        if self.approve is approve_all:
            return "runs without asking (--approve-tools)"
        if why := self._preapproved(name):
            return f"runs without asking ({why})"
        if self.approve is refuse_unasked:
            return "refused (no terminal to ask; --approve-tools runs it)"
        return "runs without asking (always, this session)" if name in getattr(self.approve, "always", ()) \
            else "asks first"

    def run(self, call: ToolCall) -> ToolResult:
        checked = self._checked(call)
        if isinstance(checked, ToolResult):
            return checked
        why = self._preapproved(call.name) if self.approve is not approve_all else None
        refusal = None if why else self.approve(call.name, checked)
        if refusal is not None:
            return ToolResult(call, refusal, "refused")
        if why:
            self.on_notice(f"{call.name} runs without asking: {why}")
        source = self.source_of(call.name)
        if source is None:  # (checked above: the call names an offered tool)
            return ToolResult(call, f"no tool named {call.name}", "refused")
        started = time.perf_counter()
        try:
            done = source.call(call.name, checked)
        except LocalchatError as exc:  # the tool ran past its limit, or its process ended
            status = "timeout" if isinstance(exc, ToolTimeout) else "error"
            return ToolResult(call, self._cut(f"error: {exc}"), status, time.perf_counter() - started)
        stopped = f"\n[localchat stopped {count(done.stopped, 'process', 'processes')} the tool left running]" \
            if done.stopped else ""
        return ToolResult(call, self._cut(done.content) + stopped, "ok" if done.ok else "error", done.seconds,
                          self._cut(done.printed))

    def _cut(self, text: str) -> str:
        """A result as it may go on: the known secrets cut out, a lone surrogate (not Unicode, and
        it cannot be sent or stored) replaced by U+FFFD."""
        for secret in self.secrets:
            text = text.replace(secret, "[secret]")
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")

    def _preapproved(self, name: str) -> str | None:
        source = self.source_of(name)
        check = getattr(source, "preapproved", None)
        return check(name) if check is not None else None

    def _checked(self, call: ToolCall) -> dict[str, Any] | ToolResult:
        """The call's arguments when they may be run; else the result saying why not."""
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError, best_match
        from jsonschema.validators import validator_for

        def invalid(why: str) -> ToolResult:
            return ToolResult(call, f"error: {why}", "invalid")

        if call.problem:
            return invalid(f"the tool call could not be read ({call.problem})")
        spec = next((s["function"] for s in self.specs if s["function"]["name"] == call.name), None)
        if spec is None:
            shown = call.name if len(call.name) <= 80 else call.name[:79] + "…"
            return invalid(f"there is no tool named {shown!r} (the tools are: {', '.join(self.names())})")
        try:
            arguments = bounded_json.loads(call.arguments or "{}")
        except ValueError as exc:
            return invalid(f"the arguments are not valid JSON ({exc})")
        if not isinstance(arguments, dict):
            return invalid("the arguments must be a JSON object of the parameters")
        if not _encodable(arguments):
            return invalid("the arguments hold text that is not valid Unicode (a lone surrogate, such as \\ud800)")
        try:
            validator_for(spec["parameters"], default=Draft202012Validator).check_schema(spec["parameters"])
            error = best_match(schema_errors(spec["parameters"], arguments, Deadline(), own_draft=True))
        except SchemaError as exc:  # a server's schema that is not one
            return invalid(f"{call.name}'s own parameter schema is invalid ({exc.message})")
        except CheckTimeout:
            return invalid(f"testing the arguments against {call.name}'s parameters took over {CHECK_BUDGET_S:g} s "
                           "(a pattern in its schema that backtracks)")
        if error is not None:
            where = "/".join(map(str, error.absolute_path)) or "the arguments"
            return invalid(f"the arguments do not fit {call.name}'s parameters ({where}: {error.message})")
        return arguments

    def close(self) -> None:
        for source in self.sources:
            source.close()


def _encodable(value: Any) -> bool:
    """Whether parsed arguments can travel on (a ``\\ud800`` escape parses to a lone surrogate)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def refuse_unasked(_: str, __: dict[str, Any]) -> str | None:
    """Without a terminal to ask and without ``--approve-tools``, no call runs."""
    return REFUSED_UNASKED


def approve_all(_: str, __: dict[str, Any]) -> str | None:
    """``--approve-tools``: every call runs."""
    return None
