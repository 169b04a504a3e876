"""A model's reply told apart: reasoning, answer and tool calls, with one parser for both backends.

Text goes through a ``TextStateMachine`` that behaves as mlx_lm.server's does (``backends.text_states``, no MLX)
with the transitions of the model's reasoning format (``templates.formats``: think markers, or
gpt-oss's harmony channels) and of its tool-call format (``templates.tool_formats``): markers are
stripped, reasoning and answer come out as typed chunks, a call's text is never shown and comes out
as one ``ToolCall`` once it is whole, and harmony's headers and other channels come out nowhere. A
prompt that ends inside an open think block (templates that write ``<think>`` themselves) starts in
the reasoning state, as mlx_lm.server does.

In-process, reasoning tokens are counted by token id, exactly: every generated token from the
format's open marker to its close marker, both included. Over HTTP, a server that does not split
the reply sends it inside ``content``: ``InlineReply`` splits it with the same parser when the
model's formats are known (its local template) or the stream opens with a reasoning marker.
"""

from __future__ import annotations

import secrets
from typing import Any

from localchat.backends import ReasoningChunk, TextChunk, ToolCall, ToolCallText
from localchat.backends.text_states import TextStateMachine
from localchat.grammar.think_budget import ReasoningCounter
from localchat.templates.reasoning_formats import ANSWER, REASONING, ReasoningFormat, sniffed
from localchat.templates.tool_formats import (
    TOOL,
    TOOL_NAME,
    ToolCallUnreadable,
    ToolFormat,
    looks_like_call,
    merged,
)

Chunks = list[ReasoningChunk | TextChunk | ToolCall | ToolCallText]


def new_call_id() -> str:
    """Nine letters and digits: what every template takes (Mistral's insists on exactly that)."""
    return secrets.token_hex(5)[:9]


def opens_reasoning(tokenizer: Any, prompt_ids: list[int], fmt: ReasoningFormat | None) -> bool:
    """True when the prompt ends inside an open think block (mlx_lm.server's initial state)."""
    if fmt is None or fmt.name != "think" or not getattr(tokenizer, "has_thinking", False):
        return False
    return tokenizer.rfind_think_start(prompt_ids) > tokenizer.rfind_think_end(prompt_ids)


class ReplySplitter:
    """Decoded text in, typed chunks out; one per model call. Without a format, all text is answer.
    ``tools`` (the offered functions) are what a call's parser may read its types from. A call in
    the family's markers is read even when no tools are offered, so that its markup is never shown
    as an answer (the turn refuses it); a whole-reply format (Llama's JSON) only with tools."""

    def __init__(self, fmt: ReasoningFormat | None, *, opened: bool = False,
                 marker_ids: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
                 tool_format: ToolFormat | None = None, tools: list[dict[str, Any]] | None = None):
        reads_calls = tool_format is not None and (bool(tools) or not tool_format.whole_reply)
        self.fmt, self.tool_format, self.tools = fmt, tool_format if reads_calls else None, list(tools or [])
        machine = TextStateMachine(merged(fmt, self.tool_format))
        self._state = machine.make_state(REASONING if opened else (fmt.start if fmt else ANSWER))
        self._counter = ReasoningCounter(*marker_ids, inside=opened) if marker_ids else None
        self._call_text = self._call_name = self._held = ""
        self._in_call = False
        self._holding: bool | None = None  # a whole-reply format: is this reply a call? (None: not known yet)
        self.calls = 0

    @classmethod
    def for_prompt(cls, fmt: ReasoningFormat | None, tokenizer: Any, prompt_ids: list[int], *,
                   tool_format: ToolFormat | None = None, tools: list[dict[str, Any]] | None = None) -> ReplySplitter:
        """In-process: the initial state from the prompt's ids, reasoning counted by token id."""
        if fmt is None:
            return cls(None, tool_format=tool_format, tools=tools)
        markers = (tuple(tokenizer.encode(fmt.open_marker, add_special_tokens=False)),
                   tuple(tokenizer.encode(fmt.close_marker, add_special_tokens=False)))
        return cls(fmt, opened=opens_reasoning(tokenizer, prompt_ids, fmt), marker_ids=markers,
                   tool_format=tool_format, tools=tools)

    @property
    def reasoning_tokens(self) -> int:
        return self._counter.count if self._counter else 0

    def feed(self, text: str, token: int | None = None) -> Chunks:
        """The chunks one piece of text completes (text that may be part of a marker is held back
        until it is known)."""
        if self._counter and token is not None:
            self._counter.add(token)
        writing = self._writing_a_call()
        self._state, segments = TextStateMachine.split(self._state, text)
        chunks = self._chunks(segments)
        if text and (writing or self._writing_a_call()):
            chunks.append(ToolCallText())
        return chunks

    def _writing_a_call(self) -> bool:
        return self._in_call or bool(self._call_name) or bool(self._held)

    def finish(self, finish_reason: str | None) -> Chunks:
        """What was held back: dropped at a stop (it was the end token), shown when cut at length;
        then a call still open (Mistral's has no end marker) or a held whole-reply call."""
        if finish_reason == "stop":
            self._state, state = TextStateMachine.discard(self._state)
            chunks = self._chunks([(state, "")])
        else:
            self._state, held, state = TextStateMachine.flush(self._state)
            chunks = self._chunks([(state, held)])
        if self._in_call:
            chunks += self._read_call()
        if self._held:
            chunks += self._read_reply(finish_reason == "stop")
        return chunks

    def _kind(self, state: str | None) -> str | None:
        if state in (TOOL, TOOL_NAME):
            return state
        return self.fmt.kind(state) if self.fmt else state

    def _chunks(self, segments: list[tuple[str | None, str]]) -> Chunks:
        out: Chunks = []
        for state, text in segments:
            kind = self._kind(state)
            if self._in_call and kind != TOOL:
                out += self._read_call()
            if kind == TOOL:
                self._in_call, self._call_text = True, self._call_text + text
            elif kind == TOOL_NAME:
                self._call_name += text
            elif text and kind == REASONING:
                out.append(ReasoningChunk(text))
            elif text and kind == ANSWER:
                out += self._answer(text)
        return out

    def _answer(self, text: str) -> Chunks:
        """Answer text; with a whole-reply format (Llama's JSON), a reply that opens like a call
        is held back until it ends."""
        if self.tool_format is None or not self.tool_format.whole_reply or self._holding is False:
            return [TextChunk(text)]
        self._held += text
        self._holding = looks_like_call(self._held)
        if self._holding is False:
            text, self._held = self._held, ""
            return [TextChunk(text)]
        return []

    def _read_call(self) -> Chunks:
        text, name = self._call_text, self._call_name
        self._in_call, self._call_text, self._call_name = False, "", ""
        return self._calls(text, name)

    def _read_reply(self, stopped: bool) -> Chunks:
        """A held reply: its calls when it reads as calls and it ended; else it was text after all."""
        text, self._held = self._held, ""
        if self._holding and stopped:
            try:
                return self._calls(text, "", strict=True)
            except ToolCallUnreadable:
                pass
        return [TextChunk(text)]

    def _calls(self, text: str, name: str, strict: bool = False) -> Chunks:
        """The calls in a call's text; one that cannot be read still comes out, with its problem,
        so that the model hears why (never as answer text)."""
        try:
            parsed = self.tool_format.parse(text, name, self.tools) if self.tool_format else []
        except ToolCallUnreadable as exc:
            if strict:
                raise
            self.calls += 1
            return [ToolCall(new_call_id(), name.strip(), text, problem=str(exc))]
        self.calls += len(parsed)
        return [ToolCall(new_call_id(), call_name, arguments) for call_name, arguments in parsed]


class InlineReply:
    """``content`` text of a server that may not split the reply itself (llama-server without a
    reasoning format, vLLM without a parser, mlx_lm.server with harmony, a server that leaves a
    call's markers in the text). Split here when the model's formats are known or the stream opens
    with a reasoning marker; reasoning is left alone once the server has sent it apart."""

    def __init__(self, fmt: ReasoningFormat | None, opened: bool = False, *, tool_format: ToolFormat | None = None,
                 tools: list[dict[str, Any]] | None = None):
        self._fmt, self._opened = fmt, opened
        self._tool_format, self._tool_list = tool_format, tools
        self._splitter: ReplySplitter | None = None
        self._pending = ""
        self._server_splits = False

    @property
    def format(self) -> ReasoningFormat | None:
        """The model's reasoning format: its template's, or the one the stream opened with."""
        return self._splitter.fmt if self._splitter and not self._server_splits else self._fmt

    @property
    def opened(self) -> bool:
        """Whether the reply started inside a reasoning block the prompt opened."""
        return self._opened and self.format is self._fmt

    def server_reasoning(self) -> None:
        """The server sent ``delta.reasoning``: it splits reasoning, so content holds none."""
        if self._splitter is None and not self._pending:
            self._server_splits = True

    def feed(self, text: str) -> Chunks:
        if self._splitter is None:
            self._pending += text
            fmt = None if self._server_splits else self._fmt or sniffed(self._pending)
            if fmt is False:
                return []  # could still be the start of a marker
            self._splitter = ReplySplitter(
                fmt if isinstance(fmt, ReasoningFormat) else None,
                opened=self._opened and fmt is self._fmt,
                tool_format=self._tool_format,
                tools=self._tool_list,
            )
            text, self._pending = self._pending, ""
        return self._splitter.feed(text)

    def finish(self, finish_reason: str | None) -> Chunks:
        if self._splitter is None:
            return [TextChunk(self._pending)] if self._pending else []
        return self._splitter.finish(finish_reason)
