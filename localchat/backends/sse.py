"""Server-sent events of a chat-completion stream, decoded into typed values in one place.

Lines become events as openai-python's ``_streaming.py`` does: a blank line dispatches, a line
starting with ``:`` is a comment, one space after ``data:`` is stripped, multi-line data is joined
with ``\\n``, ``[DONE]`` ends the stream and an ``{"error": …}`` payload raises. Each payload is
then validated field by field into a ``ChatChunk``; mlx_lm.server's ``: keepalive N/M`` comments
become ``KeepAlive``. Anything of the wrong shape is a ``StreamError`` naming the field, never an
AttributeError: the rest of the code never indexes raw JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from localchat import bounded_json
from localchat.errors import LocalchatError
from localchat.safe_text import valid_unicode

KEEPALIVE = re.compile(r"\s*keepalive\s+(\d+)\s*/\s*(\d+)\s*$")
EXCERPT = 80


class StreamError(LocalchatError):
    """The server sent an error payload or something that is not a chat-completion stream."""


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_cut: bool = False  # localchat serve's ``usage.think_budget.cut``


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a tool call (``delta.tool_calls[i]``): calls arrive split across chunks, each piece
    naming its call by ``index``; id and name usually come first, the arguments in fragments."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""
    unreadable: bool = False  # its name or arguments held text that is not Unicode (a lone surrogate)


@dataclass(frozen=True)
class ChatChunk:
    """One payload: the text it adds (answer and reasoning), and what the last ones report."""

    content: str = ""
    reasoning: str = ""  # mlx_lm.server's delta.reasoning, or delta.reasoning_content elsewhere
    finish_reason: str | None = None
    usage: Usage | None = None
    tool_calls: tuple[ToolCallDelta, ...] = ()


@dataclass(frozen=True)
class KeepAlive:
    """A comment line; ``processed``/``total`` when it is mlx_lm.server's prefill progress."""

    processed: int | None = None
    total: int | None = None


def iter_event_data(lines: Iterable[str]) -> Iterator[str | KeepAlive]:
    """The ``data`` of each event, and a ``KeepAlive`` for each comment line."""
    data: list[str] = []
    for line in lines:
        line = line.rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            yield keepalive(line[1:])
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


def keepalive(comment: str) -> KeepAlive:
    match = KEEPALIVE.match(comment)
    return KeepAlive(int(match[1]), int(match[2])) if match else KeepAlive()


def iter_stream(lines: Iterable[str]) -> Iterator[ChatChunk | KeepAlive]:
    """Typed events of a chat-completion stream, up to ``[DONE]``."""
    for item in iter_event_data(lines):
        if isinstance(item, KeepAlive):
            yield item
            continue
        if item.strip() == "[DONE]":
            return
        try:
            payload = bounded_json.loads(item)
        except ValueError:
            raise StreamError(f"the server sent data that is not JSON: {excerpt(item)}") from None
        yield parse_chunk(payload)


def parse_chunk(payload: Any) -> ChatChunk:
    """A validated chunk; the first ``choices`` entry carries the text (localchat asks for one)."""
    if isinstance(payload, dict) and payload.get("error"):
        raise StreamError(f"the server reported an error: {error_message(payload)}")
    if not isinstance(payload, dict):
        raise StreamError(f"the server sent an unexpected payload: {excerpt(payload)}")
    choices = _typed(payload, "choices", list, [])
    usage = _usage(payload.get("usage"))
    if not choices:
        return ChatChunk(usage=usage)
    choice = choices[0]
    if not isinstance(choice, dict):
        raise _wrong("choices[0]", "an object", choice)
    delta = _typed(choice, "delta", dict, {}, where="choices[0].")
    reasoning = _typed(delta, "reasoning", str, "", where="choices[0].delta.") or _typed(
        delta, "reasoning_content", str, "", where="choices[0].delta.")
    return ChatChunk(content=valid_unicode(_typed(delta, "content", str, "", where="choices[0].delta.")),
                     reasoning=valid_unicode(reasoning),
                     finish_reason=_typed(choice, "finish_reason", str, None, where="choices[0]."), usage=usage,
                     tool_calls=_tool_calls(_typed(delta, "tool_calls", list, [], where="choices[0].delta.")))


def _tool_calls(raw: list) -> tuple[ToolCallDelta, ...]:
    """``delta.tool_calls``, each piece checked; arguments a server sends as an object are JSON text."""
    pieces = []
    for position, piece in enumerate(raw):
        where = f"choices[0].delta.tool_calls[{position}]."
        if not isinstance(piece, dict):
            raise _wrong(where.rstrip("."), "an object", piece)
        index = _typed(piece, "index", int, position, where=where)
        function = _typed(piece, "function", dict, {}, where=where)
        arguments = function.get("arguments")
        if isinstance(arguments, (dict, list)):
            arguments = json.dumps(arguments, ensure_ascii=False)
        elif arguments is not None and not isinstance(arguments, str):
            raise _wrong(where + "function.arguments", "text", arguments)
        if index < 0:
            raise _wrong(where + "index", "a whole number ≥ 0", index)
        name = _typed(function, "name", str, "", where=where + "function.")
        arguments = arguments or ""
        unreadable = valid_unicode(name) != name or valid_unicode(arguments) != arguments
        pieces.append(ToolCallDelta(index=index, id=valid_unicode(_typed(piece, "id", str, "", where=where)),
                                    name=valid_unicode(name), arguments=valid_unicode(arguments),
                                    unreadable=unreadable))
    return tuple(pieces)


def _usage(raw: Any) -> Usage | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _wrong("usage", "an object", raw)
    details = _typed(raw, "prompt_tokens_details", dict, {}, where="usage.")
    budget = _typed(raw, "think_budget", dict, {}, where="usage.")
    return Usage(prompt_tokens=_count(raw, "prompt_tokens", "usage."),
                 completion_tokens=_count(raw, "completion_tokens", "usage."),
                 cached_tokens=_count(details, "cached_tokens", "usage.prompt_tokens_details."),
                 reasoning_cut=budget.get("cut") is True)


def _count(obj: dict, key: str, where: str) -> int:
    value = obj.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _wrong(where + key, "a whole number ≥ 0", value)
    return value


def _typed(obj: dict, key: str, kind: type, default: Any, where: str = "") -> Any:
    """``obj[key]`` when it is a ``kind``; the default when absent or null; else a StreamError."""
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, kind) or isinstance(value, bool):
        names: dict[type, str] = {str: "text", list: "a list", dict: "an object"}
        raise _wrong(where + key, names.get(kind, kind.__name__), value)
    return value


def _wrong(field: str, expected: str, value: Any) -> StreamError:
    return StreamError(f"the server sent a chunk whose '{field}' is not {expected}: {excerpt(value)}")


def excerpt(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = text.replace("\n", "\\n")
    return repr(text[:EXCERPT] + ("…" if len(text) > EXCERPT else ""))


def error_message(payload: Any) -> str:
    """The human part of an OpenAI-style error body (``{"error": {"message": …}}`` or a string)."""
    error = payload.get("error") if isinstance(payload, dict) else payload
    if isinstance(error, dict):
        error = error.get("message") or json.dumps(error)
    return str(error).splitlines()[0][:300] if error else "unknown error"
