"""A chat-completions stream's reply as it arrives: the answer and the reasoning (sent apart, or
split out of the content), tool calls assembled from their pieces, the last figures; the API key
cut out of all of it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from localchat.backends import Event, ReasoningChunk, TextChunk, ToolCall, ToolCallText
from localchat.backends.http import REDACTED, Redactor
from localchat.backends.reply import InlineReply, new_call_id
from localchat.backends.sse import ChatChunk, ToolCallDelta, Usage
from localchat.templates.reasoning_formats import ReasoningFormat
from localchat.templates.tool_formats import ToolFormat


class StreamedReply:
    """What a stream has said so far: the answer, the reasoning (apart, or split out of the
    content), the last figures."""

    def __init__(self, fmt: ReasoningFormat | None, opened: bool, secret: str = "", *,
                 tool_format: ToolFormat | None = None, tools: list[dict[str, Any]] | None = None):
        self.text = self.reasoning = ""
        self.finish: str | None = None
        self.usage: Usage | None = None
        self.chunks = self.reasoning_chunks = 0
        self.inline = InlineReply(fmt, opened, tool_format=tool_format, tools=tools)
        self.redact_content, self.redact_reasoning = Redactor(secret), Redactor(secret)
        self.secret = secret
        self.calls: dict[int, ToolCallDelta] = {}  # delta.tool_calls assembled by index

    def add(self, item: ChatChunk) -> Iterator[Event]:
        self.usage = item.usage or self.usage
        self.finish = item.finish_reason or self.finish
        for piece in item.tool_calls:
            self._assemble(piece)
        if item.tool_calls:
            yield ToolCallText()
        if item.reasoning:
            self.inline.server_reasoning()
            yield from self._kept([ReasoningChunk(self.redact_reasoning.feed(item.reasoning))])
        if item.content:
            yield from self._kept(self.inline.feed(self.redact_content.feed(item.content)))

    def _assemble(self, piece: ToolCallDelta) -> None:
        """A call's pieces joined: the first id that comes, the name and the arguments in order."""
        seen = self.calls.get(piece.index, ToolCallDelta(piece.index))
        self.calls[piece.index] = ToolCallDelta(piece.index, seen.id or piece.id, seen.name + piece.name,
                                                seen.arguments + piece.arguments, seen.unreadable or piece.unreadable)

    def close(self) -> Iterator[Event]:
        """What the key's redaction and the content splitter held back, once the stream has finished;
        then the calls the server sent apart, whole, in the order of their index. Their ids are
        localchat's own (the server keeps no state; mlx_lm.server's uuids would be refused back by
        Mistral's template, which wants nine letters and digits)."""
        yield from self._kept([ReasoningChunk(self.redact_reasoning.flush())])
        yield from self._kept(self.inline.feed(self.redact_content.flush()))
        yield from self._kept(self.inline.finish(self.finish))
        for _, call in sorted(self.calls.items()):
            yield ToolCall(
                new_call_id(), self.redact(call.name), self.redact(call.arguments), problem=call_problem(call)
            )

    def redact(self, text: str) -> str:
        """A whole string from the server (a call's name or arguments) with the API key cut out."""
        return text.replace(self.secret, REDACTED) if self.secret else text

    def _kept(self, chunks: Sequence[ReasoningChunk | TextChunk | ToolCall | ToolCallText]) -> Iterator[Event]:
        for chunk in chunks:
            if isinstance(chunk, (ToolCall, ToolCallText)):
                yield chunk
                continue
            if not chunk.text:
                continue
            if isinstance(chunk, ReasoningChunk):
                self.reasoning += chunk.text
                self.reasoning_chunks += 1
            else:
                self.text += chunk.text
                self.chunks += 1
            yield chunk


def call_problem(call: ToolCallDelta) -> str | None:
    """Why a call the server sent cannot be run as it is (the model hears it as the call's result)."""
    if not call.name:
        return "the server sent a tool call without a function name"
    if call.unreadable:
        return "the server sent its name or arguments with text that is not valid Unicode (a lone surrogate)"
    return None
