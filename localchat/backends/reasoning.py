"""A thinking model's reasoning, told apart from its answer in-process, as mlx_lm.server does it.

Text goes through mlx_lm's own ``TextStateMachine`` with the tokenizer's own think markers
(``has_thinking``, ``think_start``, ``think_end``): the markers are stripped, text between them is
reasoning, and a prompt that ends inside an open think block (templates that write ``<think>``
themselves) starts in the reasoning state. These are mlx_lm.server's rules, so both backends cut
the same text the same way. Tool-call markers are left alone (localchat sends no tools).

Reasoning tokens are counted by token id, exactly: every generated token from the think start
marker to the think end marker, both included.
"""

from __future__ import annotations

from typing import Any

from localchat.backends import ReasoningChunk, TextChunk

REASONING, NORMAL = "reasoning", "normal"


def _marker_ids(tokenizer: Any, marker: str) -> tuple[int, ...]:
    return tuple(tokenizer.encode(marker, add_special_tokens=False))


def opens_reasoning(tokenizer: Any, prompt_ids: list[int]) -> bool:
    """True when the prompt ends inside an open think block (mlx_lm.server's initial state)."""
    if not getattr(tokenizer, "has_thinking", False):
        return False
    return tokenizer.rfind_think_start(prompt_ids) > tokenizer.rfind_think_end(prompt_ids)


class ReasoningSplitter:
    """Decoded text in, typed chunks out; one per turn."""

    def __init__(self, tokenizer: Any, prompt_ids: list[int]):
        from mlx_lm.generate import TextStateMachine

        thinking = getattr(tokenizer, "has_thinking", False)
        transitions = {NORMAL: [(tokenizer.think_start, REASONING)],
                       REASONING: [(tokenizer.think_end, NORMAL)]} if thinking else None
        self._state = TextStateMachine(transitions).make_state(
            REASONING if opens_reasoning(tokenizer, prompt_ids) else NORMAL)
        self._counter = _ReasoningCounter(tokenizer, self._state[0] == REASONING) if thinking else None

    @property
    def reasoning_tokens(self) -> int:
        return self._counter.count if self._counter else 0

    def feed(self, text: str, token: int) -> list[ReasoningChunk | TextChunk]:
        """The chunks one generated token's text completes (text that may be part of a marker is
        held back until it is known)."""
        from mlx_lm.generate import TextStateMachine

        if self._counter:
            self._counter.add(token)
        self._state, segments = TextStateMachine.split(self._state, text)
        return _chunks(segments)

    def finish(self, finish_reason: str | None) -> list[ReasoningChunk | TextChunk]:
        """What was held back: dropped at a stop (it was the end token), shown when cut at length."""
        from mlx_lm.generate import TextStateMachine

        if finish_reason == "stop":
            self._state, _ = TextStateMachine.discard(self._state)
            return []
        self._state, held, state = TextStateMachine.flush(self._state)
        return _chunks([(state, held)])


def _chunks(segments: list[tuple[str | None, str]]) -> list[ReasoningChunk | TextChunk]:
    return [ReasoningChunk(text) if state == REASONING else TextChunk(text) for state, text in segments if text]


class _ReasoningCounter:
    """Generated token ids from the think start marker to the end marker, both included."""

    def __init__(self, tokenizer: Any, inside: bool):
        self.start, self.end = _marker_ids(tokenizer, tokenizer.think_start), _marker_ids(tokenizer, tokenizer.think_end)
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
