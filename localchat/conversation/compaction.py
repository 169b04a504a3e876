"""Summary compaction: once a conversation fills its budget, one call to the model turns every turn
but the last few into notes, placed after the system message (``Conversation.context``).

The summary call is a model call like any turn (``ChatSession.call``): recorded, timed, counted in
the figures (a compaction is never free), and judged: it must end with ``stop`` and hold notes,
not reasoning. When it does not, nothing changes and the turn falls back to trimming. The request
holds the existing summary, so a second compaction updates it rather than starting over.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from localchat.backends import Backend
from localchat.conversation.history import language
from localchat.conversation.result import Listeners, TurnResult, TurnStatus, finished

if TYPE_CHECKING:
    from localchat.conversation.turn import ChatSession

SUMMARY_PROMPT = {"en": "Summarize the conversation so far as notes.", "zh": "把目前为止的对话总结成笔记。"}
FOCUS = {"en": " Focus on: {}", "zh": "重点：{}"}
REASONING_MARKS = re.compile(r"<think>|</think>|<\|channel\|>|<\|message\|>")
DEFAULT_TRIGGER = 0.8  # the share of the budget a prompt may fill before it is compacted
DEFAULT_KEEP = 2  # turns kept verbatim after the summary


@dataclass(frozen=True)
class Compaction:
    """What a compaction did: the summary call (None when there was nothing to summarize), how
    many turns it replaced, and why nothing changed when it did not."""

    result: TurnResult | None
    replaced: int = 0
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None


@dataclass(frozen=True)
class CompactionPolicy:
    auto: bool = False  # compact before a turn whose prompt passes ``trigger`` of the budget
    trigger: float = DEFAULT_TRIGGER
    keep: int = DEFAULT_KEEP
    backend: Backend | None = None  # --compact-model; None: the chat's own model

    def run_if_due(self, session: ChatSession, prompt: str) -> Compaction | None:
        """Compact when automatic compaction is on and the next request would pass the trigger."""
        if not self.auto or not session.use_history or len(session.conversation.turns) <= self.keep:
            return None
        budget = session.known_budget()
        tokens = session.count(session.conversation.preview(prompt)) if budget else None
        if budget is None or tokens is None or tokens <= self.trigger * budget.tokens:
            return None
        return compact(session, keep=self.keep, backend=self.backend)


def summary_prompt(session: ChatSession, focus: str = "") -> str:
    """The request for notes, in the conversation's language, with the user's focus if any."""
    text = " ".join([session.conversation.context() or "", *(t.user for t in session.conversation.turns)])
    lang = language(text)
    return SUMMARY_PROMPT[lang] + (FOCUS[lang].format(focus) if focus else "")


def compact(session: ChatSession, focus: str = "", keep: int = DEFAULT_KEEP,
            backend: Backend | None = None) -> Compaction:
    """Summarize every turn but the last ``keep`` into the conversation's notes (``/compact``)."""
    conversation = session.conversation
    if len(conversation.turns) <= keep:
        return Compaction(None, reason=f"nothing to compact: {len(conversation.turns)} turn(s), and the last "
                                       f"{keep} stay as they are")
    prompt = summary_prompt(session, focus)
    head = conversation.turns[:len(conversation.turns) - keep]
    messages = conversation.preview_of(head, prompt)
    result = session.call(prompt, messages, Listeners(), backend=backend, kind="compaction", judge=_notes)
    if result.status is not TurnStatus.COMMITTED:
        return Compaction(result, reason=_why_not(result, session.params.max_tokens))
    replaced = conversation.compact(result.text.strip(), keep, result.stats)
    return Compaction(result, replaced)


def _notes(result: TurnResult) -> TurnResult:
    """A summary is kept only when it ended with ``stop``, holds text, and no reasoning leaked into it."""
    result = finished(result)
    if result.status is TurnStatus.COMMITTED and REASONING_MARKS.search(result.text):
        return replace(result, status=TurnStatus.INVALID, invalid="the summary holds reasoning markers")
    return result


def _why_not(result: TurnResult, max_tokens: int) -> str:
    return {
        TurnStatus.CUT: f"the summary was cut at --max-tokens {max_tokens}",
        TurnStatus.EMPTY: "the summary was only reasoning" if result.reasoning else "the summary was empty",
        TurnStatus.INVALID: result.invalid or "the summary was not notes",
        TurnStatus.INTERRUPTED: "the summary was interrupted",
    }.get(result.status, result.error or "the summary call failed")
