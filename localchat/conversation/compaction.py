"""Summary compaction: once a conversation fills its budget, one call to the model turns every turn
but the last few into notes, placed after the system message (``Conversation.context``).

The summary call is a model call like any turn (``Session.call``): recorded, timed, counted in
the figures (a compaction is never free), and judged: it must end with ``stop`` and hold notes,
not reasoning. When it does not, nothing changes and the turn falls back to trimming. The request
holds the existing summary, so a second compaction updates it rather than starting over.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol

from localchat.backends import Backend, GenerationParams, Message
from localchat.conversation.history import Conversation, language
from localchat.conversation.result import Compaction, Listeners, TurnResult, TurnStatus, finished
from localchat.conversation.settings import DEFAULT_KEEP, DEFAULT_TRIGGER
from localchat.safe_text import has_controls

SUMMARY_PROMPT = {"en": "Summarize the conversation so far as notes.", "zh": "把目前为止的对话总结成笔记。"}
FOCUS = {"en": " Focus on: {}", "zh": "重点：{}"}
REASONING_MARKS = re.compile(r"<think>|</think>|<\|channel\|>|<\|message\|>")


class Session(Protocol):
    """What a compaction needs of the chat session (``turn.Session``): its conversation and
    settings, the budget, token counts, and one model call made like any turn."""

    conversation: Conversation
    params: GenerationParams
    trim: Any  # turn.TrimPolicy: its max_input_chars bounds a summary
    use_history: bool

    def known_budget(self) -> Any: ...

    def count(self, messages: list[Message]) -> int | None: ...

    def call(self, prompt: str, messages: list[Message], listeners: Listeners, *, judge: Any = ...,
             backend: Backend | None = ..., kind: str = ...) -> TurnResult: ...


@dataclass(frozen=True)
class CompactionPolicy:
    auto: bool = False  # compact before a turn whose prompt passes ``trigger`` of the budget
    trigger: float = DEFAULT_TRIGGER
    keep: int = DEFAULT_KEEP
    backend: Backend | None = None  # --compact-model; None: the chat's own model

    def run_if_due(self, session: Session, prompt: str) -> Compaction | None:
        """Compact when automatic compaction is on and the next request would pass the trigger."""
        if not self.auto or not session.use_history or len(session.conversation.turns) <= self.keep:
            return None
        budget = session.known_budget()
        tokens = session.count(session.conversation.preview(prompt)) if budget else None
        if budget is None or tokens is None or tokens <= self.trigger * budget.tokens:
            return None
        return compact(session, keep=self.keep, backend=self.backend)


def summary_prompt(session: Session, focus: str = "") -> str:
    """The request for notes, in the conversation's language, with the user's focus if any."""
    text = " ".join([session.conversation.context() or "", *(t.user for t in session.conversation.turns)])
    lang = language(text)
    return SUMMARY_PROMPT[lang] + (FOCUS[lang].format(focus) if focus else "")


def compact(session: Session, focus: str = "", keep: int = DEFAULT_KEEP,
            backend: Backend | None = None) -> Compaction:
    """Summarize every turn but the last ``keep`` into the conversation's notes (``/compact``)."""
    conversation = session.conversation
    if len(conversation.turns) <= keep:
        return Compaction(None, reason=f"nothing to compact: {len(conversation.turns)} turn(s), and the last "
                                       f"{keep} stay as they are")
    prompt = summary_prompt(session, focus)
    head = conversation.turns[:len(conversation.turns) - keep]
    messages = conversation.preview_of(head, prompt)
    result = session.call(prompt, messages, Listeners(), backend=backend, kind="compaction",
                          judge=partial(_notes, max_chars=session.trim.max_input_chars))
    if result.status is not TurnStatus.COMMITTED:
        return Compaction(result, reason=_why_not(result, session.params.max_tokens))
    replaced = conversation.compact(result.text.strip(), keep, result.stats)
    return Compaction(result, replaced)


def _notes(result: TurnResult, max_chars: int) -> TurnResult:
    """A summary is kept only when it ended with ``stop`` and is plain notes: text, no reasoning
    leaked into it, no control characters (nothing a terminal would act on), and no longer than
    any message the user may type (``--max-input-chars``)."""
    result = finished(result)
    if result.status is not TurnStatus.COMMITTED:
        return result
    text = result.text.strip()
    why = ("the model called a tool instead of writing notes" if result.tool_calls else
           "the summary was empty" if not text else
           "the summary holds reasoning markers" if REASONING_MARKS.search(text) else
           "the summary holds control characters" if has_controls(text) else
           f"the summary is {len(text)} characters, over --max-input-chars ({max_chars})" if len(text) > max_chars
           else None)
    return replace(result, status=TurnStatus.INVALID, invalid=why) if why else result


def _why_not(result: TurnResult, max_tokens: int) -> str:
    return {
        TurnStatus.CUT: f"the summary was cut at --max-tokens {max_tokens}",
        TurnStatus.EMPTY: "the summary was only reasoning" if result.reasoning else "the summary was empty",
        TurnStatus.INVALID: result.invalid or "the summary was not notes",
        TurnStatus.INTERRUPTED: "the summary was interrupted",
    }.get(result.status, result.error or "the summary call failed")
