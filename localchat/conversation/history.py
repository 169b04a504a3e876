"""The one history builder: every backend sends what this module builds.

Order is always system → pinned notes → summary → accepted past turns → current question; the
system message, the pins and the summary (``context``) are one message, which trimming never
drops. A template that refuses a system role (Gemma 2, Mistral v0.2) gets it folded into the first
user message instead, the same way every turn. A turn enters the history only after its reply
finished cleanly (see ``Conversation.commit``). A thinking model's reasoning is kept beside its
turn; it goes back to the model (in the assistant message field the model's chat template renders
reasoning from) only when the template reads one. Pictures are part of their turn's question
(``Turn.images``; ``Conversation.attached`` for the next one): its content becomes OpenAI content
parts, so they are trimmed, kept and sent with the turn, never alone.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from localchat.backends import Message
from localchat.conversation.settings import DEFAULT_MAX_INPUT_CHARS
from localchat.conversation.stats import TurnStats
from localchat.errors import UsageError
from localchat.templates.render import TemplateError
from localchat.templates.traits import TemplateTraits, fold_system
from localchat.vision.image import Picture, labels_of

NEXT_QUESTION = "…"  # stands for the next question when checking that an answer renders back
NOTE_PREFIX = {"en": "Note: ", "zh": "笔记："}  # how pinned facts and summaries read (demo/notes.py)
CJK = re.compile(r"[\u3400-\u9fff]")
UNDECODED = re.compile(r"[\ud800-\udfff]")  # how Python keeps bytes that were not UTF-8 (surrogateescape)


def system_first(system: str | None, messages: list[Message], fold: bool = False) -> list[Message]:
    """The system message (when there is one), then ``messages``: the only place that order is made.
    With ``fold`` the system message becomes the head of the first user message."""
    if not system:
        return list(messages)
    if fold and messages and messages[0]["role"] == "user":
        return [{**messages[0], "content": fold_system(system, messages[0]["content"])}, *messages[1:]]
    return [{"role": "system", "content": system}, *messages]


def language(text: str) -> str:
    """"zh" when the text has Chinese characters, else "en" (for notes and the summary prompt)."""
    return "zh" if CJK.search(text) else "en"


def pin_note(text: str) -> str:
    """A pinned fact as a line of notes: ``Note: the code harbor 17.``"""
    text = text.strip()
    lang = language(text)
    if not text.startswith(tuple(NOTE_PREFIX.values())):
        text = NOTE_PREFIX[lang] + text
    return text if text[-1] in ".。!！?？" else text + ("。" if lang == "zh" else ".")


def context_message(system: str | None, pins: list[str], summary: str | None) -> str | None:
    """The system message, then the pinned facts, then the summary: one block at the top."""
    parts = [*([system] if system else []), *(pin_note(p) for p in pins), *([summary] if summary else [])]
    return "\n\n".join(parts) or None


def user_content(text: str, images: tuple[Picture, ...] = ()) -> str | list[dict[str, Any]]:
    """A user message's content: its text, or (with pictures) OpenAI content parts, the pictures
    first as most vision models were trained to see them."""
    if not images:
        return text
    return [*(picture.part() for picture in images), {"type": "text", "text": text}]


def build_messages(prompt: str, system: str | None, history: list[Message] | None = None,
                   fold: bool = False, images: tuple[Picture, ...] = ()) -> list[Message]:
    """The request's messages; a deep copy, so nothing the caller holds can change later."""
    question = {"role": "user", "content": user_content(prompt, images)}
    return copy.deepcopy(system_first(system, [*(history or []), question], fold))


def validate_input(text: str, max_chars: int = DEFAULT_MAX_INPUT_CHARS) -> str:
    """Reject what must never be sent: empty input, input over the character limit, or bytes that
    were not UTF-8 (no tokenizer or server takes them)."""
    if not text.strip():
        raise UsageError("empty input: nothing was sent")
    if len(text) > max_chars:
        raise UsageError(f"input is {len(text)} characters, over the limit of {max_chars} "
                         "(--max-input-chars): nothing was sent")
    if (bad := UNDECODED.search(text)) is not None:
        raise UsageError(f"input is not UTF-8 text (a byte that is not, at character {bad.start() + 1}): "
                         "nothing was sent")
    return text


@dataclass(frozen=True)
class ToolStep:
    """One round of a turn in which the model called tools: what it wrote beside the calls, the
    calls, and every call's result. One unit: its calls never go without their results, nor the
    other way round (an API refuses such a history)."""

    text: str
    calls: tuple[dict[str, Any], ...]  # {"id", "name", "arguments"}: arguments as an object when they are one
    results: tuple[str, ...]  # one a call, in the calls' order
    reasoning: str = ""

    def messages(self, reasoning_field: str | None = None) -> list[Message]:
        asked: Message = {"role": "assistant", "content": self.text, "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in self.calls]}
        if reasoning_field and self.reasoning:
            asked[reasoning_field] = self.reasoning
        return [asked, *({"role": "tool", "tool_call_id": c["id"], "name": c["name"], "content": result}
                         for c, result in zip(self.calls, self.results))]


@dataclass(frozen=True)
class Turn:
    user: str
    assistant: str  # the answer only
    stats: TurnStats | None = field(default=None, compare=False)  # the turn's figures, for saving
    reasoning: str = field(default="", compare=False)  # kept beside the answer, not in it
    steps: tuple[ToolStep, ...] = ()  # the rounds of tool calls before the answer, whole
    images: tuple[Picture, ...] = ()  # the pictures the question came with: trimmed, saved, logged with it

    def messages(self, reasoning_field: str | None = None) -> list[Message]:
        """The turn as messages: the question, each round of tool calls with its results, the
        answer; reasoning goes in ``reasoning_field`` when the template reads one."""
        answer: Message = {"role": "assistant", "content": self.assistant}
        if reasoning_field and self.reasoning:
            answer[reasoning_field] = self.reasoning
        steps = [m for step in self.steps for m in step.messages(reasoning_field)]
        return [{"role": "user", "content": user_content(self.user, self.images)}, *steps, answer]


def turn_messages(turns: list[Turn] | tuple[Turn, ...], reasoning_field: str | None = None) -> list[Message]:
    return [m for turn in turns for m in turn.messages(reasoning_field)]


@dataclass(frozen=True)
class Summary:
    """The model's notes of the turns a compaction replaced, placed after the system message."""

    text: str
    replaced: tuple[Turn, ...] = ()  # kept while the session is open (/uncompact); not saved
    stats: TurnStats | None = field(default=None, compare=False)


@dataclass
class Conversation:
    """Accepted turns only; trimming drops whole turns, oldest first, never the system message,
    the pinned facts or the summary."""

    system: str | None = None
    turns: list[Turn] = field(default_factory=list)
    reasoning_field: str | None = None  # the template's: see templates.traits
    fold_system: bool = False  # the template takes no system message: fold it into the first user message
    pins: list[str] = field(default_factory=list)
    summary: Summary | None = None
    attached: tuple[Picture, ...] = ()  # pictures for the next question (``--image``, ``/image``)

    @classmethod
    def for_backend(cls, backend: Any, system: str | None, turns: list[Turn] | tuple[Turn, ...] = ()) -> Conversation:
        """A conversation shaped for the backend's chat template (its probed traits), when known."""
        template = getattr(backend, "template", None)
        try:
            traits = template.traits if template is not None else TemplateTraits()
        except TemplateError:  # a runaway template: the first turn says so
            traits = TemplateTraits()
        return cls(system, list(turns), reasoning_field=traits.reasoning_field, fold_system=traits.fold_system)

    def picture_labels(self) -> dict[str, str]:
        """Every picture of the conversation (and those attached to the next question) by data URL → label."""
        return labels_of([*(p for turn in self.turns for p in turn.images), *self.attached])

    def context(self) -> str | None:
        """What every request starts with (see ``context_message``)."""
        return context_message(self.system, self.pins, self.summary.text if self.summary else None)

    def history(self) -> list[Message]:
        return turn_messages(self.turns, self.reasoning_field)

    def messages(self) -> list[Message]:
        """What ``/history`` shows: the system message and every accepted turn, as they are sent."""
        return system_first(self.context(), self.history(), self.fold_system)

    def preview(self, prompt: str, use_history: bool = True, drop: int = 0) -> list[Message]:
        """The exact messages the next request would send; never mutates the conversation.

        ``drop`` leaves out that many of the oldest turns (see ``plan_trim``).
        """
        return self.preview_of(self.turns[drop:] if use_history else [], prompt, self.attached)

    def preview_of(self, turns: list[Turn], prompt: str, images: tuple[Picture, ...] = ()) -> list[Message]:
        """The context, ``turns`` and ``prompt`` (with ``images``) as one request (a compaction's, for one)."""
        return build_messages(prompt, self.context(), turn_messages(turns, self.reasoning_field), self.fold_system,
                              images)

    def after_commit(self, turn: Turn, drop: int = 0) -> list[Message]:
        """The messages of a next request if ``turn`` were accepted (to check that the template
        would take it back); never mutates the conversation."""
        return self.preview_of([*self.turns[drop:], turn], NEXT_QUESTION)

    def commit(self, turn: Turn, drop: int = 0) -> None:
        """Accept a turn (its answer, the reasoning beside it, its rounds of tool calls); the turns
        trimmed from its request leave the history only now."""
        del self.turns[:drop]
        self.turns.append(turn)

    def take_back(self) -> Turn:
        """Remove the last accepted turn and return it (``/undo``; ``/retry`` puts it back if the
        new answer is not accepted)."""
        if not self.turns:
            notes = " (earlier turns are in the notes: /uncompact)" if self.summary else ""
            raise UsageError(f"no turn to take back: the history is empty{notes}")
        return self.turns.pop()

    def put_back(self, turn: Turn) -> None:
        self.turns.append(turn)

    def reset(self) -> None:
        """Forget every turn and the summary; the system message and the pins stay."""
        self.turns.clear()
        self.summary = None

    def compact(self, notes: str, keep: int, stats: TurnStats | None = None) -> int:
        """Replace every turn but the last ``keep`` by ``notes`` (which update any earlier summary);
        returns how many turns left the history."""
        replaced = self.turns[:max(0, len(self.turns) - keep)]
        earlier = self.summary.replaced if self.summary else ()
        self.summary = Summary(notes, (*earlier, *replaced), stats)
        del self.turns[:len(replaced)]
        return len(replaced)

    def uncompact(self) -> int:
        """Put back the turns the summary replaced (known only while the session is open) and drop
        the summary; returns how many came back."""
        if self.summary is None or not self.summary.replaced:
            return 0
        back = list(self.summary.replaced)
        self.turns[:0] = back
        self.summary = None
        return len(back)

    def plan_trim(self, prompt: str, *, max_turns: int | None = None, max_tokens: int | None = None,
                  count_tokens: Callable[[list[Message]], int | None] | None = None,
                  limit: str = "--max-context-tokens", required: bool = True, low_water: float = 1.0) -> int:
        """How many of the oldest whole turns the next request must leave out to fit the limits;
        ``limit`` names the token budget in the messages (the user's, or the model's window).

        Trimming is done in big steps: once a request would pass ``max_tokens``, whole turns go
        until it fits ``low_water × max_tokens``, so the next turns share the prompt's prefix (and
        the KV cache) until the budget is reached again. ``low_water=1`` drops as few as possible.
        When nothing can count tokens, a ``required`` budget is an error, another one is skipped."""
        drop = max(0, len(self.turns) - max_turns) if max_turns is not None else 0
        if max_tokens is None or count_tokens is None:
            return drop

        def tokens(n: int) -> int | None:
            return count_tokens(self.preview(prompt, drop=n))

        first = tokens(drop)
        if first is None:
            if not required:
                return drop
            raise UsageError(f"{limit} needs the model's tokenizer: pass --model with a model that is on this machine")
        if first <= max_tokens:
            return drop
        least = tokens(len(self.turns))
        if least is not None and least > max_tokens:
            raise UsageError(f"the system message (with pins and summary) and this input alone are {least} tokens, "
                             f"over {limit} ({max_tokens}): nothing was sent")
        return self._fewest_drops(drop + 1, tokens, int(max_tokens * min(low_water, 1.0)))

    def _fewest_drops(self, low: int, tokens: Callable[[int], int | None], target: int) -> int:
        """The fewest dropped turns whose request fits ``target``, by bisection (fewer turns, fewer
        tokens); every turn when even that does not fit the low-water mark."""
        high = len(self.turns)
        while low < high:
            middle = (low + high) // 2
            if (tokens(middle) or 0) <= target:
                high = middle
            else:
                low = middle + 1
        return high
