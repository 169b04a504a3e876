"""How a model marks a tool call in what it generates, and how the call is read back.

A format adds text transitions to mlx_lm's ``TextStateMachine`` (the reasoning format's, see
``formats``): the text of a call is in the ``tool`` state (and, for harmony, its name in
``tool-name``), never shown as answer, and read when the state ends.

- markers: the families mlx_lm knows (``TokenizerWrapper.tool_call_start/end`` and its
  ``tool_parser``: Qwen's ``<tool_call>…</tool_call>``, Mistral's ``[TOOL_CALLS]``, GLM's
  ``<arg_key>`` …): the text between the markers goes to mlx_lm's own parser.
- json: Llama 3.x answers a call with the reply itself, ``{"name": …, "parameters": {…}}``: a reply
  that opens with ``{`` is held back until it ends, then read as a call (or shown, if it is not one).
- harmony: gpt-oss writes ``to=functions.NAME`` in a header and the arguments as the message that
  ``<|call|>`` ends, in either order of recipient and channel (mlx_lm 0.32 does not parse it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localchat import bounded_json
from localchat.templates.reasoning_formats import ANSWER, REASONING, ReasoningFormat

TOOL, TOOL_NAME, TOOL_HEAD = "tool", "tool-name", "tool-head"
PYTHON_TAG = "<|python_tag|>"  # Llama 3.1 may open a call with it
Parsed = list[tuple[str, str]]  # (name, arguments as JSON text)


class ToolCallUnreadable(ValueError):
    """The text of a call could not be read as one (it goes back to the model as an error)."""


@dataclass(frozen=True)
class ToolFormat:
    name: str  # "markers" | "json" | "harmony"
    parse: Callable[[str, str, list[dict[str, Any]]], Parsed]  # (call text, name text, tools) → calls
    start: str = ""  # markers: what opens a call
    end: str = ""  # markers: what closes it ("" for Mistral: the reply's end)
    whole_reply: bool = False  # json: the reply itself is the call

    def transitions(self, reasoning: ReasoningFormat | None) -> dict[str, list[tuple[str, str]]]:
        """What this format adds to the reasoning format's state machine."""
        if self.name == "harmony":
            return _harmony_transitions()
        if self.name != "markers":
            return {}
        opening = [(self.start, TOOL)]
        added = {ANSWER: opening, TOOL: [(self.end, ANSWER)] if self.end else []}
        if reasoning is not None and reasoning.name == "think":
            added[REASONING] = opening  # a call straight out of the reasoning, as mlx_lm allows
        return added


def markers(tokenizer: Any) -> ToolFormat:
    """The format mlx_lm infers for this tokenizer's template, read with mlx_lm's parser."""
    parser = tokenizer.tool_parser

    def parse(text: str, _: str, tools: list[dict[str, Any]]) -> Parsed:
        try:
            found = parser(text, tools)
        except (ValueError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ToolCallUnreadable(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
        return [_named(call) for call in (found if isinstance(found, list) else [found])]

    return ToolFormat("markers", parse, start=tokenizer.tool_call_start, end=tokenizer.tool_call_end or "")


def json_reply() -> ToolFormat:
    """Llama 3.x: ``{"name": …, "parameters": {…}}`` (or a list of them) as the whole reply."""
    def parse(text: str, _: str, __: list[dict[str, Any]]) -> Parsed:
        try:
            found = bounded_json.loads(text.strip().removeprefix(PYTHON_TAG))
        except json.JSONDecodeError as exc:
            raise ToolCallUnreadable(f"not JSON ({exc.msg})") from None
        return [_named(call) for call in (found if isinstance(found, list) else [found])]

    return ToolFormat("json", parse, whole_reply=True)


def harmony_calls() -> ToolFormat:
    def parse(text: str, name: str, _: list[dict[str, Any]]) -> Parsed:
        if not name.strip():
            raise ToolCallUnreadable("a commentary message to no function")
        return [(name.strip(), text.strip())]

    return ToolFormat("harmony", parse)


def looks_like_call(text: str) -> bool | None:
    """json: whether a reply that has begun is a call (it opens with ``{``, ``[`` or the python
    tag); None while only blanks have come."""
    head = text.lstrip()
    if not head:
        return None
    return head[0] in "{[" or PYTHON_TAG.startswith(head[:len(PYTHON_TAG)]) or head.startswith(PYTHON_TAG)


def reads_as_call(fmt: ToolFormat | None, text: str) -> bool:
    """Whether a whole reply is a call in a whole-reply format (Llama's ``{"name", "parameters"}``):
    such a reply is no answer when no tools were offered. Marked calls are read as calls anyway."""
    if fmt is None or not fmt.whole_reply or not looks_like_call(text):
        return False
    try:
        return bool(fmt.parse(text, "", []))
    except ToolCallUnreadable:
        return False


def _named(call: Any) -> tuple[str, str]:
    """mlx_lm's parsers give ``{"name": …, "arguments": {…}}``; Llama writes ``parameters``."""
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise ToolCallUnreadable(f"not a call: {json.dumps(call, ensure_ascii=False)[:80]}")
    arguments = call.get("arguments", call.get("parameters", {}))
    return call["name"], arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def _harmony_transitions() -> dict[str, list[tuple[str, str]]]:
    """``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>`` and
    ``to=functions.NAME<|channel|>commentary json<|message|>ARGS<|call|>``."""
    recipient = ("to=functions.", TOOL_NAME)
    return {
        "header": [("<|channel|>commentary", "commentary-head"), recipient],
        "commentary-head": [recipient, ("<|message|>", "other")],
        TOOL_NAME: [("<|channel|>", TOOL_HEAD), ("<|constrain|>", TOOL_HEAD), ("<|message|>", TOOL)],
        TOOL_HEAD: [("<|message|>", TOOL)],
        TOOL: [("<|call|>", "header"), ("<|end|>", "header")],
    }


def merged(reasoning: ReasoningFormat | None, tools: ToolFormat | None) -> dict[str, list[tuple[str, str]]] | None:
    """The state machine's transitions for both formats (None: no transitions at all)."""
    table: dict[str, list[tuple[str, str]]] = {}
    for part in (reasoning.transitions if reasoning else {}, tools.transitions(reasoning) if tools else {}):
        for state, edges in part.items():
            table.setdefault(state, []).extend(edges)
    return table or None
