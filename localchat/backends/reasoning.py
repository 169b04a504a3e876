"""A model's reasoning, told apart from its answer, with one parser for both backends.

Text goes through mlx_lm's own ``TextStateMachine`` with the transitions of the model's reasoning
format (``templates.formats``: think markers, or gpt-oss's harmony channels): markers are stripped,
reasoning and answer come out as typed chunks, and harmony's headers and other channels come out
nowhere. A prompt that ends inside an open think block (templates that write ``<think>``
themselves) starts in the reasoning state, as mlx_lm.server does.

In-process, reasoning tokens are counted by token id, exactly: every generated token from the
format's open marker to its close marker, both included. Over HTTP, a server that does not split
reasoning sends it inside ``content``: ``InlineReasoning`` splits it with the same parser when the
model's format is known (its local template) or the stream opens with a marker.
"""

from __future__ import annotations

from typing import Any

from localchat.backends import ReasoningChunk, TextChunk
from localchat.templates.formats import ANSWER, REASONING, ReasoningFormat, sniffed

Chunks = list[ReasoningChunk | TextChunk]


def opens_reasoning(tokenizer: Any, prompt_ids: list[int], fmt: ReasoningFormat | None) -> bool:
    """True when the prompt ends inside an open think block (mlx_lm.server's initial state)."""
    if fmt is None or fmt.name != "think" or not getattr(tokenizer, "has_thinking", False):
        return False
    return tokenizer.rfind_think_start(prompt_ids) > tokenizer.rfind_think_end(prompt_ids)


class ReasoningSplitter:
    """Decoded text in, typed chunks out; one per turn. Without a format, all text is answer."""

    def __init__(self, fmt: ReasoningFormat | None, *, opened: bool = False,
                 marker_ids: tuple[tuple[int, ...], tuple[int, ...]] | None = None):
        from mlx_lm.generate import TextStateMachine

        self.fmt = fmt
        machine = TextStateMachine(fmt.transitions if fmt else None)
        self._state = machine.make_state(REASONING if opened else (fmt.start if fmt else ANSWER))
        self._counter = _ReasoningCounter(*marker_ids, inside=opened) if marker_ids else None

    @classmethod
    def for_prompt(cls, fmt: ReasoningFormat | None, tokenizer: Any, prompt_ids: list[int]) -> ReasoningSplitter:
        """In-process: the initial state from the prompt's ids, reasoning counted by token id."""
        if fmt is None:
            return cls(None)
        markers = tuple(tuple(tokenizer.encode(m, add_special_tokens=False)) for m in (fmt.open_marker, fmt.close_marker))
        return cls(fmt, opened=opens_reasoning(tokenizer, prompt_ids, fmt), marker_ids=markers)

    @property
    def reasoning_tokens(self) -> int:
        return self._counter.count if self._counter else 0

    def feed(self, text: str, token: int | None = None) -> Chunks:
        """The chunks one piece of text completes (text that may be part of a marker is held back
        until it is known)."""
        from mlx_lm.generate import TextStateMachine

        if self._counter and token is not None:
            self._counter.add(token)
        self._state, segments = TextStateMachine.split(self._state, text)
        return self._chunks(segments)

    def finish(self, finish_reason: str | None) -> Chunks:
        """What was held back: dropped at a stop (it was the end token), shown when cut at length."""
        from mlx_lm.generate import TextStateMachine

        if finish_reason == "stop":
            self._state, _ = TextStateMachine.discard(self._state)
            return []
        self._state, held, state = TextStateMachine.flush(self._state)
        return self._chunks([(state, held)])

    def _chunks(self, segments: list[tuple[str | None, str]]) -> Chunks:
        kind = self.fmt.kind if self.fmt else (lambda state: state)
        return [ReasoningChunk(text) if kind(state) == REASONING else TextChunk(text)
                for state, text in segments if text and kind(state) in (REASONING, ANSWER)]


class InlineReasoning:
    """``content`` text of a server that may not split reasoning itself (llama-server without a
    reasoning format, vLLM without a parser, mlx_lm.server with harmony). Split here when the
    model's format is known or the stream opens with a marker; left alone once the server has sent
    reasoning apart, before any content."""

    def __init__(self, fmt: ReasoningFormat | None, opened: bool = False):
        self._fmt, self._opened = fmt, opened
        self._splitter: ReasoningSplitter | None = None
        self._pending = ""
        self._server_splits = False

    @property
    def format(self) -> ReasoningFormat | None:
        """The format the content is split with: the model's, or the one the stream opened with."""
        return self._splitter.fmt if self._splitter else self._fmt

    @property
    def opened(self) -> bool:
        """Whether the reply started inside a reasoning block the prompt opened."""
        return self._opened and self.format is self._fmt

    def server_reasoning(self) -> None:
        """The server sent ``delta.reasoning``: it splits, so content is the answer."""
        if self._splitter is None and not self._pending:
            self._server_splits = True

    def feed(self, text: str) -> Chunks:
        if self._server_splits:
            return [TextChunk(text)]
        if self._splitter is None:
            self._pending += text
            fmt = self._fmt or sniffed(self._pending)
            if fmt is False:
                return []  # could still be the start of a marker
            self._splitter = ReasoningSplitter(fmt or None, opened=self._opened and fmt is self._fmt)
            text, self._pending = self._pending, ""
        return self._splitter.feed(text)

    def finish(self, finish_reason: str | None) -> Chunks:
        if self._splitter is None:
            return [TextChunk(self._pending)] if self._pending else []
        return self._splitter.finish(finish_reason)


class _ReasoningCounter:
    """Generated token ids from the open marker to the close marker, both included."""

    def __init__(self, start: tuple[int, ...], end: tuple[int, ...], inside: bool):
        self.start, self.end = start, end
        self.inside, self.count, self.recent = inside, 0, []

    def add(self, token: int) -> None:
        self.recent = (self.recent + [token])[-max(len(self.start), len(self.end)):]
        if self.inside:
            self.count += 1
            self.inside = not self._ends_with(self.end)
        elif self._ends_with(self.start):
            self.inside, self.count = True, self.count + len(self.start)

    def _ends_with(self, marker: tuple[int, ...]) -> bool:
        return bool(marker) and tuple(self.recent[-len(marker):]) == marker
