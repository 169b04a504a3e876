"""Server-sent events, decoded line by line (the shape of openai-python's ``_streaming.py``).

A blank line dispatches an event; a line starting with ``:`` is a comment (mlx_lm.server's
``: keepalive`` during long prefills); one space after ``data:`` is stripped and multi-line data
is joined with ``\\n``; ``[DONE]`` ends the stream; an ``{"error": …}`` payload raises.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from localchat.errors import LocalchatError


class StreamError(LocalchatError):
    """The server sent an error payload or something that is not a chat-completion stream."""


def iter_event_data(lines: Iterable[str]) -> Iterator[str]:
    """The ``data`` of each event; comments, ``event:``/``id:``/``retry:`` and junk lines are skipped."""
    data: list[str] = []
    for line in lines:
        line = line.rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


def iter_chunks(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """JSON payloads of a chat-completion stream, up to ``[DONE]``."""
    for data in iter_event_data(lines):
        if data.strip() == "[DONE]":
            return
        try:
            payload = json.loads(data)
        except ValueError:
            raise StreamError(f"the server sent data that is not JSON: {data[:80]!r}") from None
        if isinstance(payload, dict) and payload.get("error"):
            raise StreamError(f"the server reported an error: {error_message(payload)}")
        if not isinstance(payload, dict):
            raise StreamError(f"the server sent an unexpected payload: {data[:80]!r}")
        yield payload


def error_message(payload: Any) -> str:
    """The human part of an OpenAI-style error body (``{"error": {"message": …}}`` or a string)."""
    error = payload.get("error") if isinstance(payload, dict) else payload
    if isinstance(error, dict):
        error = error.get("message") or json.dumps(error)
    return str(error).splitlines()[0][:300] if error else "unknown error"
