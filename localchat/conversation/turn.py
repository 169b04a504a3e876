"""One chat turn, end to end: input → history builder → backend → clock → checks → commit.

The session never prints; callers pass ``on_text`` (and ``on_reasoning``) to see the reply as it
streams and get a ``TurnResult`` back, with one ``TurnStatus``. A turn is committed only when its
reply ended with the runtime's ``finish_reason == "stop"``, has a non-empty answer and, in JSON
mode, its answer validates against the schema; errors, truncation (inside the reasoning or after
it) and Ctrl+C leave the history unchanged. Only the answer is committed: a thinking model's
reasoning is kept beside the turn (records, saved sessions) and sent back only when the model's
template asks for it (see ``Conversation.reasoning_in_history``). With a recorder,
the request record is written before the call and the response record before the commit.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from functools import partial
from typing import Any

from localchat.backends import Backend, Finished, GenerationParams, Message, Progress, ReasoningChunk, TextChunk
from localchat.conversation.history import DEFAULT_MAX_INPUT_CHARS, Conversation, validate_input
from localchat.conversation.jsonmode import AnswerSchema
from localchat.conversation.records import TurnRecorder
from localchat.conversation.stats import Ledger, TurnClock, TurnStats, stats_to_dict
from localchat.errors import LocalchatError, OutputError, TerminationRequested, UsageError
from localchat.templates.render import TemplateError


class TurnStatus(str, Enum):
    """What became of a turn; the runtime's own ``finish_reason`` is kept apart in its stats."""

    COMMITTED = "committed"
    NOT_KEPT = "not-kept"  # a good reply, but history is off
    CUT = "cut"  # the runtime stopped at max-tokens
    EMPTY = "empty"  # the reply ended with no text
    INVALID = "invalid-json"
    UNRENDERABLE = "unrenderable"  # the model's chat template would refuse the answer back in history
    ERROR = "error"
    INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class TurnResult:
    prompt: str
    messages: list[Message]  # exactly what was sent
    text: str  # the answer
    stats: TurnStats
    status: TurnStatus
    dropped_turns: int = 0
    trimmed_for: str | None = None  # the limit that made the oldest turns leave the request
    error: str | None = None
    trace: str | None = field(default=None, repr=False)  # an unexpected failure's traceback
    answer: Any = None  # JSON mode: the parsed, valid reply
    invalid: str | None = None  # JSON mode: why the reply failed validation
    reasoning: str = ""  # a thinking model's reasoning, apart from the answer
    token_gaps_s: tuple[float, ...] = field(default=(), repr=False)  # ITL, from the clock

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


@dataclass(frozen=True)
class TokenBudget:
    """The most prompt tokens a request may hold, and what sets it."""

    tokens: int
    limit: str
    required: bool  # the user's own budget: counting must be possible


@dataclass(frozen=True)
class TrimPlan:
    drop: int
    limit: str | None


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
        return self.conversation.preview(prompt, self.use_history, self._plan_trim(prompt).drop)

    def ask(self, prompt: str, on_text: Callable[[str], None] = lambda _: None,
            on_progress: Callable[[Progress], None] = lambda _: None,
            on_reasoning: Callable[[str], None] = lambda _: None) -> TurnResult:
        """Run one turn. Raises UsageError for input that must not be sent (nothing changes) and
        RecordError when a turn record cannot be written (see ``localchat.conversation.records``).
        SIGTERM (``TerminationRequested``) ends the turn as interrupted, records it, then goes on up."""
        validate_input(prompt, self.trim.max_input_chars)
        clock = TurnClock()
        try:
            trim = self._plan_trim(prompt)
        except TemplateError as exc:  # counting tokens renders the template: nothing was sent
            return TurnResult(prompt=prompt, messages=[], text="", stats=clock.finish(None), status=TurnStatus.ERROR,
                              error=str(exc))
        messages = self.conversation.preview(prompt, self.use_history, trim.drop)
        record_id = self.recorder.request(self._request_record(messages)) if self.recorder else None
        outcome = _StreamOutcome()
        try:
            self._stream(messages, clock, _Listeners(on_text, on_reasoning, on_progress), outcome)
        except TerminationRequested:
            outcome.failure, outcome.terminated = TurnStatus.INTERRUPTED, True
        except OutputError as exc:  # the display failed, not the model: recorded, then the command ends
            outcome.failure, outcome.error, outcome.unshowable = TurnStatus.ERROR, str(exc), exc
        stats = clock.finish(outcome.done)
        self.ledger.add(stats)
        result = self._judged(trim, TurnResult(
            prompt=prompt, messages=messages, text=clock.text, reasoning=clock.reasoning, stats=stats,
            token_gaps_s=clock.gaps(),
            status=outcome.failure or TurnStatus.COMMITTED, dropped_turns=trim.drop, trimmed_for=trim.limit,
            error=outcome.error, trace=outcome.trace))
        if self.recorder and record_id is not None:
            self.recorder.response(record_id, self._response_record(result, outcome.terminated))
        if outcome.terminated:
            raise TerminationRequested()
        if outcome.unshowable:
            raise outcome.unshowable
        if result.committed:
            self.conversation.commit(prompt, result.text, trim.drop, stats, reasoning=result.reasoning)
        return result

    def _stream(self, messages: list[Message], clock: TurnClock, listeners: _Listeners,
                outcome: _StreamOutcome) -> None:
        """Feed the backend's events to the clock; what happened goes into ``outcome``. No
        exception but SIGTERM's leaves a turn: an unexpected one is an error with its traceback."""
        events = self.backend.stream(messages, self.params)
        try:
            for event in events:
                if isinstance(event, TextChunk):
                    clock.on_text(event.text)
                    if event.text:
                        listeners.on_text(event.text)
                elif isinstance(event, ReasoningChunk):
                    clock.on_reasoning(event.text)
                    if event.text:
                        listeners.on_reasoning(event.text)
                elif isinstance(event, Progress):
                    listeners.on_progress(event)
                elif isinstance(event, Finished):
                    outcome.done = event
        except (TerminationRequested, OutputError):
            raise
        except KeyboardInterrupt:
            outcome.failure = TurnStatus.INTERRUPTED
        except LocalchatError as exc:
            outcome.error, outcome.failure = str(exc), TurnStatus.ERROR
        except Exception as exc:  # a bug or a library's surprise must not end the REPL or lose history
            outcome.error = f"unexpected {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            outcome.failure, outcome.trace = TurnStatus.ERROR, traceback.format_exc()
        finally:
            events.close()
        if outcome.done is None and outcome.failure is None:
            outcome.error, outcome.failure = "the reply ended without the runtime's final report", TurnStatus.ERROR

    def _judged(self, trim: TrimPlan, result: TurnResult) -> TurnResult:
        """The status of a turn that streamed to its end: cut, empty, invalid, unrenderable, kept or not."""
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
        if not self.use_history:
            return replace(result, status=TurnStatus.NOT_KEPT)
        refusal = self._refused_back(trim, result)
        return replace(result, status=TurnStatus.UNRENDERABLE, error=refusal) if refusal else result

    def _refused_back(self, trim: TrimPlan, result: TurnResult) -> str | None:
        """Why the model's chat template would refuse this answer in the next request (gpt-oss
        refuses channel tags in content, for one), or None; unknown without a local template."""
        template = self.backend.template
        if template is None:
            return None
        after = self.conversation.after_commit(result.prompt, result.text, trim.drop, result.reasoning)
        try:
            template.text(after, self.params.think)
        except TemplateError as exc:
            return str(exc)
        return None

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
    def _response_record(result: TurnResult, terminated: bool = False) -> dict[str, Any]:
        return {
            "text": result.text, "reasoning": result.reasoning or None, "status": result.status.value, "finish_reason": result.stats.finish_reason,
            "committed": result.committed, "error": result.error, "invalid": result.invalid,
            "signal": "SIGTERM" if terminated else None,
            "dropped_turns": result.dropped_turns, "stats": stats_to_dict(result.stats),
        }

    def token_budget(self) -> TokenBudget | None:
        """The tighter of the user's ``--max-context-tokens`` and the model's context window less
        the reply's ``--max-tokens``; None when neither is known."""
        budgets = []
        if self.trim.max_context_tokens:
            budgets.append(TokenBudget(self.trim.max_context_tokens, "--max-context-tokens", True))
        window = self.backend.context_length()
        if window:
            if self.params.max_tokens >= window:
                raise UsageError(f"--max-tokens {self.params.max_tokens} leaves no room for a prompt in "
                                 f"{self.backend.model_id}'s context of {window} tokens")
            budgets.append(TokenBudget(window - self.params.max_tokens,
                                       f"the model's context ({window} tokens less --max-tokens "
                                       f"{self.params.max_tokens})", False))
        return min(budgets, key=lambda b: b.tokens) if budgets else None

    def _plan_trim(self, prompt: str) -> TrimPlan:
        budget = self.token_budget()
        drop = self.conversation.plan_trim(
            prompt, max_turns=self.trim.max_turns, max_tokens=budget.tokens if budget else None,
            count_tokens=partial(self.backend.count_tokens, think=self.params.think) if budget else None,
            limit=budget.limit if budget else "--max-context-tokens", required=budget.required if budget else True)
        by_turns = self.conversation.plan_trim(prompt, max_turns=self.trim.max_turns)
        if drop == 0:
            return TrimPlan(0, None)
        return TrimPlan(drop, budget.limit if budget and drop > by_turns else "--max-turns")


@dataclass(frozen=True)
class _Listeners:
    on_text: Callable[[str], None]
    on_reasoning: Callable[[str], None]
    on_progress: Callable[[Progress], None]


@dataclass
class _StreamOutcome:
    done: Finished | None = None
    error: str | None = None
    failure: TurnStatus | None = None
    trace: str | None = None
    terminated: bool = False
    unshowable: OutputError | None = None
