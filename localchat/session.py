"""One chat turn, end to end: input → history builder → backend → clock → checks → commit.

The session never prints; callers pass ``on_text`` to see the reply as it streams and get a
``TurnResult`` back. A turn is committed only when its reply ended with ``finish_reason ==
"stop"``, has non-empty text and, in JSON mode, validates against the schema; errors,
truncation and Ctrl+C leave the history unchanged. With a recorder, the request record is
written before the call and the response record before the commit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from localchat.backends import Backend, Finished, GenerationParams, TextChunk
from localchat.errors import LocalchatError
from localchat.history import DEFAULT_MAX_INPUT_CHARS, Conversation, Message, validate_input
from localchat.jsonmode import AnswerSchema
from localchat.records import TurnRecorder
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
    answer: Any = None  # JSON mode: the parsed, valid reply
    invalid: str | None = None  # JSON mode: why the reply failed validation

    @property
    def finished_cleanly(self) -> bool:
        return self.stats.finish_reason == "stop" and bool(self.text.strip())

    @property
    def accepted(self) -> bool:
        return self.finished_cleanly and self.invalid is None


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
    schema: AnswerSchema | None = None
    recorder: TurnRecorder | None = None

    def preview(self, prompt: str) -> list[Message]:
        """The exact request the next turn would send (trimming included); changes nothing."""
        return self.conversation.preview(prompt, self.use_history, self._plan_trim(prompt))

    def ask(self, prompt: str, on_text: Callable[[str], None] = lambda _: None) -> TurnResult:
        """Run one turn. Raises UsageError for input that must not be sent (nothing changes) and
        RecordError when a turn record cannot be written (see ``localchat.records``)."""
        validate_input(prompt, self.trim.max_input_chars)
        clock = TurnClock()
        dropped = self._plan_trim(prompt)
        messages = self.conversation.preview(prompt, self.use_history, dropped)
        record_id = self.recorder.request(self._request_record(messages)) if self.recorder else None
        done, error, reason = self._stream(messages, clock, on_text)
        stats = clock.finish(done, reason)
        self.ledger.add(stats)
        result = self._checked(TurnResult(prompt, messages, clock.text, stats, False, dropped, error))
        result = replace(result, committed=result.accepted and self.use_history)
        if self.recorder and record_id is not None:
            self.recorder.response(record_id, self._response_record(result))
        if result.committed:
            self.conversation.commit(prompt, result.text, dropped, asdict(stats))
        return result

    def _stream(self, messages: list[Message], clock: TurnClock,
                on_text: Callable[[str], None]) -> tuple[Finished | None, str | None, str | None]:
        """Feed the backend's events to the clock; (the runtime's report, error, finish reason)."""
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
        return done, error, reason

    def _checked(self, result: TurnResult) -> TurnResult:
        if self.schema is None or not result.finished_cleanly:
            return result
        answer, invalid = self.schema.check(result.text)
        return replace(result, answer=answer, invalid=invalid)

    def _request_record(self, messages: list[Message]) -> dict[str, Any]:
        """Exactly what is sent, and with which settings; credentials never appear here."""
        return {
            "mode": "history" if self.use_history else "no-history",
            "json_schema": self.schema.schema if self.schema else None,
            "backend": self.backend.name,
            "url": getattr(self.backend, "url", None),
            "model": self.backend.model_id,
            "params": asdict(self.params),
            "messages": messages,
        }

    @staticmethod
    def _response_record(result: TurnResult) -> dict[str, Any]:
        return {
            "text": result.text, "finish_reason": result.stats.finish_reason,
            "committed": result.committed, "error": result.error, "invalid": result.invalid,
            "dropped_turns": result.dropped_turns, "stats": asdict(result.stats),
        }

    def _plan_trim(self, prompt: str) -> int:
        return self.conversation.plan_trim(
            prompt, max_turns=self.trim.max_turns,
            max_tokens=self.trim.max_context_tokens,
            count_tokens=self.backend.count_tokens if self.trim.max_context_tokens else None)
