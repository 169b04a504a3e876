"""One chat turn, end to end: input → history builder → backend → clock → commit.

The session never prints; callers pass ``on_text`` to see the reply as it streams and get a
``TurnResult`` back. A turn is committed only when its reply ended with ``finish_reason ==
"stop"`` and non-empty text; errors, truncation and Ctrl+C leave the history unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from localchat.backends import Backend, Finished, GenerationParams, TextChunk
from localchat.errors import LocalchatError
from localchat.history import DEFAULT_MAX_INPUT_CHARS, Conversation, Message, validate_input
from localchat.stats import Ledger, TurnClock, TurnStats

INTERRUPTED = "interrupted"
ERROR = "error"


@dataclass(frozen=True)
class TurnResult:
    prompt: str
    messages: list[Message]  # exactly what was sent
    text: str
    stats: TurnStats
    committed: bool
    dropped_turns: int = 0
    error: str | None = None

    @property
    def accepted(self) -> bool:
        return self.stats.finish_reason == "stop" and bool(self.text.strip())


@dataclass
class TrimPolicy:
    max_turns: int | None = None
    max_context_tokens: int | None = None
    max_input_chars: int = DEFAULT_MAX_INPUT_CHARS


@dataclass
class ChatSession:
    backend: Backend
    conversation: Conversation
    params: GenerationParams
    use_history: bool = True
    trim: TrimPolicy = field(default_factory=TrimPolicy)
    ledger: Ledger = field(default_factory=Ledger)

    def preview(self, prompt: str) -> list[Message]:
        """The exact request the next turn would send (trimming included); changes nothing."""
        return self.conversation.preview(prompt, self.use_history, self._plan_trim(prompt))

    def ask(self, prompt: str, on_text: Callable[[str], None] = lambda _: None) -> TurnResult:
        """Run one turn. Raises UsageError for input that must not be sent (nothing changes)."""
        validate_input(prompt, self.trim.max_input_chars)
        clock = TurnClock()
        dropped = self._plan_trim(prompt)
        messages = self.conversation.preview(prompt, self.use_history, dropped)
        done, error, reason = None, None, None
        events = self.backend.stream(messages, self.params)
        try:
            for event in events:
                if isinstance(event, TextChunk):
                    clock.on_text(event.text)
                    if event.text:
                        on_text(event.text)
                elif isinstance(event, Finished):
                    done = event
        except KeyboardInterrupt:
            reason = INTERRUPTED
        except LocalchatError as exc:
            error, reason = str(exc), ERROR
        finally:
            events.close()
        stats = clock.finish(done, reason)
        self.ledger.add(stats)
        result = TurnResult(prompt, messages, clock.text, stats, False, dropped, error)
        if result.accepted and self.use_history:
            self.conversation.commit(prompt, result.text, dropped)
            result = TurnResult(prompt, messages, clock.text, stats, True, dropped, error)
        return result

    def _plan_trim(self, prompt: str) -> int:
        return self.conversation.plan_trim(
            prompt, max_turns=self.trim.max_turns,
            max_tokens=self.trim.max_context_tokens,
            count_tokens=self.backend.count_tokens if self.trim.max_context_tokens else None)
