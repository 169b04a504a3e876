"""What an OpenAI chat-completions request asks to be enforced, read and checked before anything
is generated: ``response_format`` (``json_object``, ``json_schema``), ``tool_choice`` (``none``,
``auto``, ``required``, one function by name), and localchat's ``guided_regex``/``guided_choice``.
It is plain data: it travels with the request to every rank."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from localchat.errors import UsageError
from localchat.grammar.answer_formats import MAX_CHOICES, AnswerFormat, regex_format
from localchat.grammar.think_budget import ThinkBudget, budget_of_effort, checked_message, parse_budget

MAX_TOOLS = 128
MAX_SCHEMA_DEPTH = 64  # JSON levels of one schema: far past any tool's; deeper ones exhaust the compiler's stack
CONTROL_OR_EDGE_SPACE = re.compile(r"[\x00-\x1f\x7f]|^\s|\s$")


class RequestRefused(Exception):
    """A 400 in OpenAI's error shape, naming the request's field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Enforcement:
    kind: str  # what is enforced, as the header says it: json_schema, regex, tool_choice=required, …=function:add
    schema: dict[str, Any] | None = None
    pattern: str | None = None
    choices: tuple[str, ...] = ()
    tools: list[dict[str, Any]] = field(default_factory=list)  # the tools a call may use
    calls: str = "auto"  # auto | none | required

    def answer(self) -> AnswerFormat | None:
        if self.schema is not None:
            return AnswerFormat("", schema=self.schema, name="response_format")
        if self.pattern is not None:
            return AnswerFormat("", pattern=self.pattern, name="guided_regex")
        return AnswerFormat("", choices=self.choices, name="guided_choice") if self.choices else None

    def banned_marker(self, traits: Any, tokenizer: Any) -> Any:
        """``tool_choice: none``: the family's call marker, when it is one token, can never come."""
        fmt = traits.tool_format
        if self.calls != "none" or fmt is None or not fmt.start:
            return None
        ids = tokenizer.encode(fmt.start, add_special_tokens=False)
        return BanToken(ids[0]) if len(ids) == 1 else None


def enforced_request(completion_request: type) -> type:
    """mlx_lm's ``CompletionRequest`` with what is enforced, as a field of our own: plain data that
    is pickled to every rank with the request. Made once, and named in this module (where pickle
    looks for it on every rank)."""
    made = globals().get("EnforcedRequest")
    if made is not None and made.__bases__ == (completion_request,):
        return made

    @dataclass
    class EnforcedRequest(completion_request):
        enforcement: Enforcement | None = None
        think_budget: ThinkBudget | None = None

    EnforcedRequest.__module__, EnforcedRequest.__qualname__ = __name__, "EnforcedRequest"
    globals()["EnforcedRequest"] = EnforcedRequest
    return EnforcedRequest


class BanToken:
    """A processor that never lets one token through (its mask made once, at the first step)."""

    def __init__(self, token: int) -> None:
        self.token = token
        self._keep: Any = None

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx

        if self._keep is None or self._keep.size != logits.shape[-1]:
            self._keep = mx.ones(logits.shape[-1], dtype=mx.bool_)
            self._keep[self.token] = False
        return mx.where(self._keep, logits, mx.array(-float("inf"), dtype=logits.dtype))


def _format(body: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """(kind, the Enforcement fields) of the answer's format, or None."""
    rf = body.get("response_format")
    if rf is not None:
        kind = rf.get("type") if isinstance(rf, dict) else None
        if kind == "json_object":
            return "json_object", {"schema": {"type": "object"}}
        if kind == "json_schema":
            spec = rf.get("json_schema")
            schema = spec.get("schema", {"type": "object"}) if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise RequestRefused("response_format.json_schema.schema must be a JSON Schema object",
                                     "response_format")
            if depth(schema) > MAX_SCHEMA_DEPTH:
                raise RequestRefused(f"response_format's schema nests deeper than {MAX_SCHEMA_DEPTH} levels",
                                     "response_format")
            return "json_schema", {"schema": schema}
        if kind != "text":
            raise RequestRefused("response_format.type must be text, json_object or json_schema", "response_format")
    if (pattern := body.get("guided_regex")) is not None:
        if not isinstance(pattern, str):
            raise RequestRefused("guided_regex must be a string", "guided_regex")
        try:
            return "regex", {"pattern": regex_format(pattern).pattern}
        except UsageError as exc:
            raise RequestRefused(str(exc).replace("--regex", "guided_regex"), "guided_regex") from None
    if (choices := body.get("guided_choice")) is not None:
        if not isinstance(choices, list) or not all(isinstance(c, str) and c for c in choices) \
                or not 2 <= len(set(choices)) <= MAX_CHOICES:
            raise RequestRefused(f"guided_choice must be a list of 2 to {MAX_CHOICES} strings", "guided_choice")
        if any(CONTROL_OR_EDGE_SPACE.search(c) for c in choices):
            raise RequestRefused("guided_choice: a choice cannot hold a control character (NUL, a line break) or "
                                 "begin or end with a space: the reply is compared with its spaces trimmed",
                                 "guided_choice")
        return "choice", {"choices": tuple(dict.fromkeys(choices))}
    return None


def _tool_name(tool: Any) -> str | None:
    function = tool.get("function") if isinstance(tool, dict) else None
    return function.get("name") if isinstance(function, dict) else None


def depth(value: Any) -> int:
    """How deep a JSON value nests (counted without recursion: a hostile one may be deep)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def checked_tools(tools: Any) -> list[dict[str, Any]]:
    """``tools`` as OpenAI defines it, or a 400 naming the first that is not one."""
    if tools is None:
        return []
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise RequestRefused(f"tools must be a list of at most {MAX_TOOLS} functions", "tools")
    for number, tool in enumerate(tools):
        name = _tool_name(tool)
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(name, str) \
                or not name:
            raise RequestRefused(f'tools[{number}] must be {{"type": "function", "function": {{"name": …}}}}', "tools")
        parameters = tool["function"].get("parameters", {})
        if not isinstance(parameters, dict):
            raise RequestRefused(f"tools[{number}] ({name[:60]}): parameters must be a JSON Schema object", "tools")
        if depth(parameters) > MAX_SCHEMA_DEPTH:
            raise RequestRefused(f"tools[{number}] ({name[:60]}): parameters nest deeper than {MAX_SCHEMA_DEPTH} "
                                 "levels", "tools")
    return tools


def _calls(body: dict[str, Any]) -> tuple[str, list[dict[str, Any]], str]:
    """(auto | none | required, the tools a call may use, what the header says was enforced)."""
    tools = checked_tools(body.get("tools"))
    choice = body.get("tool_choice", "auto")
    if choice in ("auto", "none", "required"):
        if choice == "required" and not tools:
            raise RequestRefused("tool_choice is required but no tools were given", "tool_choice")
        return choice, list(tools), f"tool_choice={choice}"
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) and isinstance(
        choice.get("function"), dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise RequestRefused('tool_choice must be none, auto, required or {"type": "function", "function": '
                             '{"name": …}}', "tool_choice")
    named = [t for t in tools if _tool_name(t) == name]
    if not named:
        raise RequestRefused(f"tool_choice names {name!r}, which is not among the tools given", "tool_choice")
    return "required", named, f"tool_choice=function:{name}"


def _check(fmt: AnswerFormat | None, tools: list[dict[str, Any]], calls: str) -> None:
    """The grammar compiles (a byte tokenizer: no model needed), or a 400 naming why."""
    from localchat.grammar.compile import GrammarError, check, refused_tools

    if fmt is not None:
        try:
            check(fmt, None)
        except GrammarError as exc:
            raise RequestRefused(str(exc), "response_format" if fmt.schema is not None else fmt.name) from None
    if calls == "required":
        for name, why in refused_tools(tools, None).items():
            raise RequestRefused(f"tool {name!r}: its parameters cannot be enforced: {why}", "tools")


def think_budget_of(body: dict[str, Any], default: ThinkBudget | None) -> ThinkBudget | None:
    """The request's thinking budget: localchat's ``think_budget`` (tokens, or ``"none"``) with its
    ``think_budget_message``, else OpenAI's ``reasoning_effort`` (``EFFORT_BUDGETS``), else ``serve
    --think-budget`` (``default``); ``RequestRefused`` for nonsense."""
    try:
        message = checked_message(body.get("think_budget_message"))
    except ValueError as exc:
        raise RequestRefused(str(exc), "think_budget_message") from None
    try:
        if "think_budget" in body:
            tokens = parse_budget(body["think_budget"])
            return ThinkBudget(tokens=tokens, message=message) if tokens is not None else None
    except ValueError as exc:
        raise RequestRefused(str(exc), "think_budget") from None
    try:
        if body.get("reasoning_effort") is not None:
            return budget_of_effort(body["reasoning_effort"])
    except ValueError as exc:
        raise RequestRefused(str(exc), "reasoning_effort") from None
    return default


def enforcement_of(body: dict[str, Any]) -> Enforcement | None:
    """What ``body`` asks to be enforced (None: nothing), or ``RequestRefused``."""
    found = _format(body)
    calls, tools, said = _calls(body)
    if found is None and not tools:
        return None
    if body.get("stop") and (found is not None or calls == "required"):
        raise RequestRefused("stop cannot be combined with an enforced format or required calls: a stop string "
                             "would cut the answer before the format ends", "stop")
    kind, fields = found or ("", {})
    enforcement = Enforcement(kind=",".join(k for k in (kind, said if tools else "") if k),
                              tools=tools if calls != "none" else [], calls=calls, **fields)
    _check(enforcement.answer(), enforcement.tools, calls)
    return enforcement
