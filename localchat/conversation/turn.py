"""One chat turn, end to end: input → history builder → backend → clock → checks → commit.

The session never prints; callers pass ``Listeners`` to see the reply as it streams and get a
``TurnResult`` back, with one ``TurnStatus``. A turn is committed only when its reply ended with
the runtime's ``finish_reason == "stop"``, has a non-empty answer and, in JSON mode, its answer
validates against the schema; errors, truncation (inside the reasoning or after it) and Ctrl+C
leave the history unchanged. Only the answer is committed: a thinking model's reasoning is kept
beside the turn (records, saved sessions) and sent back only in the field the model's template
reads. Every model call (``call``: a turn, or a compaction's summary) is recorded and timed the
same way: the request record before the call, the response record before anything is committed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

from localchat.backends import Backend, GenerationParams, Message
from localchat.conversation.compaction import CompactionPolicy
from localchat.conversation.history import NEXT_QUESTION, Conversation, ToolStep, Turn, validate_input
from localchat.conversation.records import TurnRecorder
from localchat.conversation.result import (
    Compaction,
    Listeners,
    StreamOutcome,
    TurnResult,
    TurnStatus,
    consume,
    finished,
    response_record,
)
from localchat.conversation.result_cuts import fit_results
from localchat.conversation.settings import TrimPolicy
from localchat.conversation.stats import Ledger, TurnClock
from localchat.conversation.tool_rounds import answer_with_tools
from localchat.errors import OutputError, TerminationRequested, UsageError
from localchat.grammar.answer_formats import AnswerFormat
from localchat.templates.render import TemplateError
from localchat.templates.tool_formats import reads_as_call
from localchat.tools.runner import ToolRunner


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
    schema: AnswerFormat | None = None
    recorder: TurnRecorder | None = None
    compaction: CompactionPolicy | None = None  # automatic summary compaction (see ``compaction``)
    tools: ToolRunner | None = None  # the functions the model may call (see ``tool_rounds``)
    _said_unenforced: bool = field(default=False, repr=False)

    def prepare(self) -> ChatSession:
        """Do now what the first turn would otherwise do inside its clock: load the model's template
        (a server backend's local tokenizer) and learn its context window (a server's /v1/models),
        so that the first TTFT is the model's, not a one-time set-up's."""
        _ = self.backend.template
        self.known_budget()
        if (self.schema is not None or self.tools is not None) and hasattr(self.backend, "prepare_answer"):
            self.backend.prepare_answer(self.schema)  # a format that cannot be enforced: one line, no call
        return self

    def preview(self, prompt: str) -> list[Message]:
        """The exact request the next turn would send (trimming included); changes nothing."""
        return self.conversation.preview(prompt, self.use_history, self._plan_trim(prompt).drop)

    def ask(self, prompt: str, listeners: Listeners | None = None,
            on_compaction: Callable[[Compaction], None] = lambda _: None) -> TurnResult:
        """Run one turn. Raises UsageError for input that must not be sent (nothing changes) and
        RecordError when a turn record cannot be written (see ``localchat.conversation.records``).
        With automatic compaction, a conversation past its trigger is summarized first (its figures
        are its own, heard by ``on_compaction``); an interrupted compaction ends the turn there."""
        validate_input(prompt, self.trim.max_input_chars)
        compaction = self.compaction.run_if_due(self, prompt) if self.compaction else None
        if compaction is not None:
            on_compaction(compaction)
            if compaction.result is not None and compaction.result.status is TurnStatus.INTERRUPTED:
                return replace(compaction.result, compaction=compaction)
        clock = TurnClock()
        try:
            trim = self._plan_trim(prompt)
        except TemplateError as exc:  # counting tokens renders the template: nothing was sent
            return TurnResult(prompt=prompt, messages=[], text="", stats=clock.finish(None), status=TurnStatus.ERROR,
                              error=str(exc), compaction=compaction)
        messages = self.conversation.preview(prompt, self.use_history, trim.drop)
        try:
            result = self._answer(prompt, messages, listeners or Listeners(), clock, trim)
            if result.committed:
                self.conversation.commit(self._turn_of(result), trim.drop)
        finally:
            self.conversation.attached = ()  # the question that was sent took its pictures
        return replace(result, compaction=compaction)

    def _answer(self, prompt: str, messages: list[Message], listeners: Listeners, clock: TurnClock,
                trim: TrimPlan) -> TurnResult:
        """One model call; with tools, as many rounds as the model's calls take (``tool_rounds``)."""
        def call(sent: list[Message], round_clock: TurnClock) -> TurnResult:
            if self.tools is not None and self.tools.refresh():  # a server's tools/list_changed
                self.backend.offer_tools(self.tools.specs)
            return self.call(prompt, sent, listeners, clock=round_clock, judge=partial(self._judged, trim), trim=trim)

        if self.tools is None:
            return call(messages, clock)
        return answer_with_tools(call, self.tools, messages, listeners, clock=clock, ledger=self.ledger,
                                 reasoning_field=self.conversation.reasoning_field, fit=self._fit_step)

    def _fit_step(self, sent: list[Message], step: ToolStep) -> tuple[ToolStep, list[str]]:
        """A round's results as the next request can hold them (see ``result_cuts``); as they are when
        the budget or the counting is unknown here (a server then refuses in its own words)."""
        budget = self.known_budget()
        if budget is None:
            return step, []
        reasoning_field = self.conversation.reasoning_field

        def tokens_of(candidate: ToolStep) -> int | None:
            try:
                return self.count([*sent, *candidate.messages(reasoning_field)])
            except TemplateError:
                return None

        return fit_results(step, tokens_of, budget.tokens, budget.limit)

    def _turn_of(self, result: TurnResult) -> Turn:
        return Turn(result.prompt, result.text, result.stats, result.reasoning, result.steps,
                    images=self.conversation.attached)

    def retry(self, listeners: Listeners | None = None,
              on_compaction: Callable[[Compaction], None] = lambda _: None) -> TurnResult:
        """Ask the last question again, without its answer in the request; the old answer leaves
        the history only when the new one is accepted."""
        if not self.conversation.turns:
            raise UsageError("nothing to retry: no question has been answered and kept yet")
        last, pending = self.conversation.take_back(), self.conversation.attached
        self.conversation.attached = last.images  # the question goes again with its own pictures …
        try:
            result = self.ask(last.user, listeners, on_compaction)
        except BaseException:
            self.conversation.put_back(last)
            raise
        finally:
            self.conversation.attached = pending  # … and what was attached for the next one waits for it
        if not result.committed:
            self.conversation.put_back(last)
        return result

    def call(self, prompt: str, messages: list[Message], listeners: Listeners, *, clock: TurnClock | None = None,
             judge: Callable[[TurnResult], TurnResult] = finished, trim: TrimPlan | None = None,
             backend: Backend | None = None, kind: str = "turn") -> TurnResult:
        """One model call, recorded and timed like any turn; ``judge`` decides its status before the
        response is recorded. SIGTERM and a failing display end it (recorded), then go on up."""
        backend, clock, trim = backend or self.backend, clock or TurnClock(), trim or TrimPlan(0, None)
        record_id = self.recorder.request(self._request_record(messages, backend, kind)) if self.recorder else None
        outcome = StreamOutcome()
        try:
            consume(backend.stream(messages, self.params), clock, listeners, outcome)
        except TerminationRequested:
            outcome.failure, outcome.terminated = TurnStatus.INTERRUPTED, True
        except OutputError as exc:  # the display failed, not the model: recorded, then the command ends
            outcome.failure, outcome.error, outcome.unshowable = TurnStatus.ERROR, str(exc), exc
        budget = self.known_budget()
        stats = replace(clock.finish(outcome.done), budget_tokens=budget.tokens if budget else None)
        self.ledger.add(stats, self._ledger_kind(kind, outcome))
        result = judge(TurnResult(
            prompt=prompt, messages=messages, text=clock.text, reasoning=clock.reasoning, stats=stats,
            token_gaps_s=clock.gaps(), status=outcome.failure or TurnStatus.COMMITTED, dropped_turns=trim.drop,
            trimmed_for=trim.limit, error=outcome.error, trace=outcome.trace, tool_calls=tuple(outcome.tool_calls)))
        if self.recorder and record_id is not None:
            self.recorder.response(record_id, response_record(result, outcome.terminated))
        if outcome.terminated:
            raise TerminationRequested()
        if outcome.unshowable:
            raise outcome.unshowable
        return result

    @staticmethod
    def _ledger_kind(kind: str, outcome: StreamOutcome) -> str:
        """What ``/stats`` counts a call as: a turn, a round of tool calls, an interrupted turn."""
        if kind != "turn":
            return kind
        if outcome.failure is TurnStatus.INTERRUPTED:
            return "interrupted"
        return "tool-round" if outcome.tool_calls else kind

    def _judged(self, trim: TrimPlan, result: TurnResult) -> TurnResult:
        """The status of a turn that streamed to its end: cut, empty, invalid, unrenderable, kept or not."""
        result = finished(result)
        if result.status is TurnStatus.COMMITTED and self.tools is None and self._is_a_call(result):
            names = ", ".join(sorted({c.name or "?" for c in result.tool_calls})) or "a tool"
            return replace(result, status=TurnStatus.ERROR,
                           error=f"the model answered with a call to {names}, but no tools are offered here "
                                 "(--tools FILE.py offers them): not added to history")
        if result.status is not TurnStatus.COMMITTED or result.tool_calls:  # a round of calls: judged by its answer
            return result
        if self.schema is not None:
            answer, invalid = self.schema.check(result.text)
            if invalid is not None:
                return replace(result, status=TurnStatus.INVALID, invalid=invalid, notes=self._unenforced())
            result = replace(result, answer=answer)
        if not self.use_history:
            return replace(result, status=TurnStatus.NOT_KEPT)
        refusal = self._refused_back(trim, result)
        return replace(result, status=TurnStatus.UNRENDERABLE, error=refusal) if refusal else result

    def _unenforced(self) -> tuple[str, ...]:
        """A server sent a reply that fails the format it was asked to enforce: said once a session."""
        if self.backend.name != "server" or self._said_unenforced or self.schema is None:
            return ()
        self._said_unenforced = True
        field = "response_format" if self.schema.schema is not None else "guided_regex / guided_choice"
        return (f"the server did not enforce {self.schema.described()} ({field} was sent)",)

    def _is_a_call(self, result: TurnResult) -> bool:
        """A reply that asked for tools: calls read from it, or (JSON mode aside) a whole reply in the
        family's call format."""
        if result.tool_calls:
            return True
        template = self.backend.template
        try:
            fmt = template.traits.tool_format if template is not None else None
        except TemplateError:
            return False
        return self.schema is None and reads_as_call(fmt, result.text)

    def _refused_back(self, trim: TrimPlan, result: TurnResult) -> str | None:
        """Why the model's chat template would refuse this answer in the next request (gpt-oss
        refuses channel tags in content, for one), or None; unknown without a local template."""
        template = self.backend.template
        if template is None:
            return None
        after = self.conversation.after_commit(self._turn_of(result), trim.drop)
        try:
            template.text(after, self.params.think)
        except TemplateError as exc:
            return str(exc)
        return None

    def _request_record(self, messages: list[Message], backend: Backend, kind: str) -> dict[str, Any]:
        """Exactly what is sent, and with which settings; credentials never appear here."""
        return {
            "kind": kind,
            "mode": "history" if self.use_history else "no-history",
            "json_schema": self.schema.schema if self.schema else None,
            "backend": backend.name,
            "url": getattr(backend, "url", None),
            "model": backend.model_id,
            "params": asdict(self.params),
            "tools": self.tools.specs if self.tools else None,
            "messages": messages,
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

    def known_budget(self) -> TokenBudget | None:
        """The budget for the context gauge; None when it cannot be known (it is never an error here)."""
        try:
            return self.token_budget()
        except UsageError:
            return None

    def count(self, messages: list[Message]) -> int | None:
        """The prompt tokens of ``messages``, as the backend counts them (None when it cannot)."""
        return self.backend.count_tokens(messages, self.params.think)

    def pin(self, text: str) -> None:
        """Keep ``text`` after the system message, where trimming and compaction never reach; a
        pin that cannot fit the budget with the shortest question is refused, nothing changes."""
        validate_input(text, self.trim.max_input_chars)
        self.conversation.pins.append(text.strip())
        self._context_must_fit("this pin", "not pinned", undo=self.conversation.pins.pop)

    def set_system(self, text: str | None) -> None:
        """A new system message from the next turn (None: none), checked like any input and
        against the budget; one that cannot fit is refused and the old one stays."""
        if text is not None:
            validate_input(text, self.trim.max_input_chars)
        before = self.conversation.system
        self.conversation.system = text

        def undo() -> None:
            self.conversation.system = before

        self._context_must_fit("this system message", "the system message is unchanged", undo=undo)

    def _context_must_fit(self, what: str, unchanged: str, undo: Callable[[], Any]) -> None:
        """After a change to the context (system message, pins): if it alone, with the shortest
        question, passes the token budget, ``undo`` it and say so."""
        try:
            budget = self.token_budget()
            tokens = self.count(self.conversation.preview(NEXT_QUESTION, drop=len(self.conversation.turns))) \
                if budget else None
        except (UsageError, TemplateError):
            undo()
            raise
        if budget and tokens is not None and tokens > budget.tokens:
            undo()
            raise UsageError(f"{what} would make the system message and pins alone {tokens} tokens, over "
                             f"{budget.limit} ({budget.tokens}): {unchanged}")

    def _plan_trim(self, prompt: str) -> TrimPlan:
        budget = self.token_budget()
        drop = self.conversation.plan_trim(
            prompt, max_turns=self.trim.max_turns, max_tokens=budget.tokens if budget else None,
            count_tokens=partial(self.backend.count_tokens, think=self.params.think) if budget else None,
            limit=budget.limit if budget else "--max-context-tokens", required=budget.required if budget else True,
            low_water=self.trim.trim_to)
        by_turns = self.conversation.plan_trim(prompt, max_turns=self.trim.max_turns)
        if drop == 0:
            return TrimPlan(0, None)
        return TrimPlan(drop, budget.limit if budget and drop > by_turns else "--max-turns")


