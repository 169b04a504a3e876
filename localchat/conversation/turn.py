"""One chat turn, end to end: input → history builder → backend → clock → checks → commit.

The session never prints; callers pass ``on_text`` to see the reply as it streams and get a
``TurnResult`` back, with one ``TurnStatus``. A turn is committed only when its reply ended with
the runtime's ``finish_reason == "stop"``, has non-empty text and, in JSON mode, validates
against the schema; errors, truncation and Ctrl+C leave the history unchanged. With a recorder,
the request record is written before the call and the response record before the commit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Any

from localchat.backends import Backend, Finished, GenerationParams, Message, TextChunk
from localchat.conversation.history import (
    DEFAULT_MAX_INPUT_CHARS,
    Conversation,
    validate_input,
)
from localchat.conversation.jsonmode import AnswerSchema
from localchat.conversation.records import TurnRecorder
from localchat.conversation.stats import Ledger, TurnClock, TurnStats, stats_to_dict
from localchat.errors import LocalchatError


class TurnStatus(str, Enum):
    """What became of a turn; the runtime's own ``finish_reason`` is kept apart in its stats."""

    COMMITTED = "committed"
    NOT_KEPT = "not-kept"  # a good reply, but history is off
    CUT = "cut"  # the runtime stopped at max-tokens
    EMPTY = "empty"  # the reply ended with no text
    INVALID = "invalid-json"
    ERROR = "error"
    INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class TurnResult:
    prompt: str
    messages: list[Message]  # exactly what was sent
    text: str
    stats: TurnStats
    status: TurnStatus
    dropped_turns: int = 0
    error: str | None = None
    answer: Any = None  # JSON mode: the parsed, valid reply
    invalid: str | None = None  # JSON mode: why the reply failed validation

    @property
    def committed(self) -> bool:
        return self.status is TurnStatus.COMMITTED

    @property
    def accepted(self) -> bool:
        """A reply good enough for history (committed, or would be with history on)."""
        return self.status in (TurnStatus.COMMITTED, TurnStatus.NOT_KEPT)


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
        RecordError when a turn record cannot be written (see ``localchat.conversation.records``)."""
        validate_input(prompt, self.trim.max_input_chars)
        clock = TurnClock()
        dropped = self._plan_trim(prompt)
        messages = self.conversation.preview(prompt, self.use_history, dropped)
        record_id = self.recorder.request(self._request_record(messages)) if self.recorder else None
        done, error, failure = self._stream(messages, clock, on_text)
        stats = clock.finish(done)
        self.ledger.add(stats)
        result = self._judged(TurnResult(prompt=prompt, messages=messages, text=clock.text, stats=stats,
                                         status=failure or TurnStatus.COMMITTED, dropped_turns=dropped,
                                         error=error))
        if self.recorder and record_id is not None:
            self.recorder.response(record_id, self._response_record(result))
        if result.committed:
            self.conversation.commit(prompt, result.text, dropped, stats)
        return result

    def _stream(self, messages: list[Message], clock: TurnClock, on_text: Callable[[str], None]
                ) -> tuple[Finished | None, str | None, TurnStatus | None]:
        """Feed the backend's events to the clock; (the runtime's report, error, failure status)."""
        done, error, failure = None, None, None
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
            failure = TurnStatus.INTERRUPTED
        except LocalchatError as exc:
            error, failure = str(exc), TurnStatus.ERROR
        finally:
            events.close()
        if done is None and failure is None:
            error, failure = "the reply ended without the runtime's final report", TurnStatus.ERROR
        return done, error, failure

    def _judged(self, result: TurnResult) -> TurnResult:
        """The status of a turn that streamed to its end: cut, empty, invalid, kept or not."""
        if result.status is not TurnStatus.COMMITTED:
            return result
        if result.stats.finish_reason != "stop":
            return replace(result, status=TurnStatus.CUT)
        if not result.text.strip():
            return replace(result, status=TurnStatus.EMPTY)
        if self.schema is not None:
            answer, invalid = self.schema.check(result.text)
            if invalid is not None:
                return replace(result, status=TurnStatus.INVALID, invalid=invalid)
            result = replace(result, answer=answer)
        return result if self.use_history else replace(result, status=TurnStatus.NOT_KEPT)

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
            "text": result.text, "status": result.status.value, "finish_reason": result.stats.finish_reason,
            "committed": result.committed, "error": result.error, "invalid": result.invalid,
            "dropped_turns": result.dropped_turns, "stats": stats_to_dict(result.stats),
        }

    def _plan_trim(self, prompt: str) -> int:
        return self.conversation.plan_trim(
            prompt, max_turns=self.trim.max_turns,
            max_tokens=self.trim.max_context_tokens,
            count_tokens=self.backend.count_tokens if self.trim.max_context_tokens else None)
