"""The one history builder: every backend sends what this module builds.

Order is always system → accepted past turns → current question; the system message appears
once. A turn enters the history only after its reply finished cleanly (see ``Conversation.commit``).
A thinking model's reasoning is kept beside its turn; it goes back to the model (as the assistant
message's ``reasoning_content``) only when the model's chat template reads that field.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

from localchat.backends import Message
from localchat.conversation.stats import TurnStats
from localchat.errors import UsageError

DEFAULT_MAX_INPUT_CHARS = 8000


def system_first(system: str | None, messages: list[Message]) -> list[Message]:
    """The system message (when there is one), then ``messages``: the only place that order is made."""
    return ([{"role": "system", "content": system}] if system else []) + list(messages)


def build_messages(prompt: str, system: str | None, history: list[Message] | None = None) -> list[Message]:
    """The request's messages; a deep copy, so nothing the caller holds can change later."""
    return copy.deepcopy(system_first(system, [*(history or []), {"role": "user", "content": prompt}]))


def validate_input(text: str, max_chars: int = DEFAULT_MAX_INPUT_CHARS) -> str:
    """Reject what must never be sent: empty input, or input over the character limit."""
    if not text.strip():
        raise UsageError("empty input: nothing was sent")
    if len(text) > max_chars:
        raise UsageError(f"input is {len(text)} characters, over the limit of {max_chars} "
                         "(--max-input-chars): nothing was sent")
    return text


@dataclass(frozen=True)
class Turn:
    user: str
    assistant: str  # the answer only
    stats: TurnStats | None = field(default=None, compare=False)  # the turn's figures, for saving
    reasoning: str = field(default="", compare=False)  # kept beside the answer, not in it

    def messages(self, with_reasoning: bool = False) -> list[Message]:
        answer: Message = {"role": "assistant", "content": self.assistant}
        if with_reasoning and self.reasoning:
            answer["reasoning_content"] = self.reasoning
        return [{"role": "user", "content": self.user}, answer]


def turn_messages(turns: list[Turn] | tuple[Turn, ...], with_reasoning: bool = False) -> list[Message]:
    return [m for turn in turns for m in turn.messages(with_reasoning)]


def template_reads_reasoning(chat_template: str | None) -> bool:
    """Whether a chat template renders the assistant's ``reasoning_content`` (its own convention
    then decides which turns' reasoning the model sees again)."""
    return bool(chat_template) and "reasoning_content" in chat_template


@dataclass
class Conversation:
    """Accepted turns only; trimming drops whole turns, oldest first, never the system message."""

    system: str | None = None
    turns: list[Turn] = field(default_factory=list)
    reasoning_in_history: bool = False  # see template_reads_reasoning

    def history(self) -> list[Message]:
        return turn_messages(self.turns, self.reasoning_in_history)

    def messages(self) -> list[Message]:
        """What ``/history`` shows: the system message and every accepted turn."""
        return system_first(self.system, self.history())

    def preview(self, prompt: str, use_history: bool = True, drop: int = 0) -> list[Message]:
        """The exact messages the next request would send; never mutates the conversation.

        ``drop`` leaves out that many of the oldest turns (see ``plan_trim``).
        """
        kept = self.turns[drop:] if use_history else []
        return build_messages(prompt, self.system, turn_messages(kept, self.reasoning_in_history))

    def commit(self, prompt: str, reply: str, drop: int = 0, stats: TurnStats | None = None,
               reasoning: str = "") -> None:
        """Accept a turn (its answer; the reasoning beside it); the turns trimmed from its request
        leave the history only now."""
        del self.turns[:drop]
        self.turns.append(Turn(prompt, reply, stats, reasoning))

    def reset(self) -> None:
        self.turns.clear()

    def plan_trim(self, prompt: str, *, max_turns: int | None = None, max_tokens: int | None = None,
                  count_tokens: Callable[[list[Message]], int | None] | None = None,
                  limit: str = "--max-context-tokens", required: bool = True) -> int:
        """How many of the oldest whole turns the next request must leave out to fit the limits;
        ``limit`` names the token budget in the messages (the user's, or the model's window).
        When nothing can count tokens, a ``required`` budget is an error, another one is skipped."""
        drop = max(0, len(self.turns) - max_turns) if max_turns is not None else 0
        if max_tokens is None or count_tokens is None:
            return drop
        while True:
            tokens = count_tokens(self.preview(prompt, drop=drop))
            if tokens is None:
                if not required:
                    return drop
                raise UsageError(f"{limit} needs the model's tokenizer: pass --model "
                                 "with a model that is on this machine")
            if tokens <= max_tokens:
                return drop
            if drop >= len(self.turns):
                raise UsageError(f"the system message and this input alone are {tokens} tokens, over "
                                 f"{limit} ({max_tokens}): nothing was sent")
            drop += 1
