"""What one model call gives: its status, its result, and the backend's events fed to the clock.

A turn (``turn``) and a compaction (``compaction``) are both calls: the same stream handling, the
same clock, the same checks that the reply ended with ``stop`` and holds text.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Any

from localchat.backends import (
    Event,
    Finished,
    Message,
    PrefillProgress,
    ReasoningChunk,
    TextChunk,
    ToolCall,
    ToolCallText,
)
from localchat.conversation.history import ToolStep
from localchat.conversation.stats import TurnClock, TurnStats, stats_to_dict
from localchat.errors import LocalchatError, OutputError, TerminationRequested


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
    compaction: Compaction | None = field(default=None, repr=False)  # the summary call made before this turn
    tool_calls: tuple[ToolCall, ...] = ()  # what this call asked to run (a round that ends in calls)
    steps: tuple[ToolStep, ...] = ()  # the turn's earlier rounds: their calls and results, whole
    rounds: tuple[TurnStats, ...] = ()  # the figures of those rounds (``stats`` are the last one's)
    tool_s: float = 0.0  # time spent inside tools, apart from model time
    notes: tuple[str, ...] = ()  # what the figures line adds (a server that did not enforce a format)

    @property
    def committed(self) -> bool:
        return self.status is TurnStatus.COMMITTED

    @property
    def tool_prompt_tokens(self) -> int:
        """What the turn's calls and their results added to the answer's prompt (over the first round's)."""
        return self.stats.prompt_tokens - self.rounds[0].prompt_tokens if self.rounds else 0

    @property
    def accepted(self) -> bool:
        """A reply good enough for history (committed, or would be with history on)."""
        return self.status in (TurnStatus.COMMITTED, TurnStatus.NOT_KEPT)


@dataclass(frozen=True)
class Compaction:
    """What a compaction did (``compaction.compact``): the summary call (None when there was
    nothing to summarize), how many turns it replaced, and why nothing changed when it did not."""

    result: TurnResult | None
    replaced: int = 0
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None


@dataclass(frozen=True)
class Listeners:
    """Who hears the reply as it streams (the UI); nobody by default."""

    on_text: Callable[[str], None] = lambda _: None
    on_reasoning: Callable[[str], None] = lambda _: None
    on_progress: Callable[[PrefillProgress], None] = lambda _: None
    on_tool_call: Callable[[ToolCall], None] = lambda _: None
    on_tool_result: Callable[[Any], None] = lambda _: None  # a ``tools.runner.ToolResult``, after the call ran
    on_round: Callable[[TurnResult], None] = lambda _: None  # a round that ended in calls, before they run
    on_notice: Callable[[str], None] = lambda _: None  # what the turn did that the user should know (a result cut)


@dataclass
class StreamOutcome:
    done: Finished | None = None
    error: str | None = None
    failure: TurnStatus | None = None
    trace: str | None = None
    terminated: bool = False
    unshowable: OutputError | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)


def consume(events: Iterator[Event], clock: TurnClock, listeners: Listeners, outcome: StreamOutcome) -> None:
    """Feed the backend's events to the clock; what happened goes into ``outcome``. No exception
    but SIGTERM's and a failing display's leaves a call: an unexpected one is an error with its
    traceback."""
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
            elif isinstance(event, ToolCallText):
                clock.on_tool_call()
            elif isinstance(event, ToolCall):  # its text arrived on the clock as ToolCallText
                outcome.tool_calls.append(event)
                listeners.on_tool_call(event)
            elif isinstance(event, PrefillProgress):
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
        close = getattr(events, "close", None)  # (a generator's: the backend's request ends with it)
        if close is not None:
            close()
    if outcome.done is None and outcome.failure is None:
        outcome.error, outcome.failure = "the reply ended without the runtime's final report", TurnStatus.ERROR


def finished(result: TurnResult) -> TurnResult:
    """A call that streamed to its end: cut (not ``stop``), empty, or good for history. A round that
    ended in tool calls is good as it is (its answer comes in a later round)."""
    if result.status is not TurnStatus.COMMITTED:
        return result
    if result.tool_calls and result.stats.finish_reason in ("tool_calls", "stop"):
        return result
    if result.stats.finish_reason != "stop":
        return replace(result, status=TurnStatus.CUT)
    if not result.text.strip():
        return replace(result, status=TurnStatus.EMPTY)
    return result


def response_record(result: TurnResult, terminated: bool = False) -> dict[str, Any]:
    """What a call's response record keeps (see ``records``)."""
    return {
        "text": result.text, "reasoning": result.reasoning or None, "status": result.status.value,
        "finish_reason": result.stats.finish_reason,
        "committed": result.committed, "error": result.error, "invalid": result.invalid,
        "signal": "SIGTERM" if terminated else None,
        "dropped_turns": result.dropped_turns, "stats": stats_to_dict(result.stats),
        "tool_calls": [asdict(call) for call in result.tool_calls] or None,
    }
