"""A thinking budget, enforced while decoding: once a reply's reasoning holds ``budget`` tokens,
its family's end of reasoning is forced, one token a step (an optional closing sentence first,
as llama-server's ``--reasoning-budget-message``); the answer then decodes freely. A reasoning that
ends before the budget is untouched. The same machinery as the grammar's mask (an mlx_lm logits
processor, one per reply: in a batch each request has its own), used in-process and in serve's engine.

Counted as the figures line counts reasoning (``ReasoningCounter``): generated token ids from the
open marker to the close marker, both included. A prompt that opens the reasoning itself (Qwen3's
templates with thinking forced on) leaves the opener out of the count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from localchat.templates.reasoning_formats import ReasoningFormat

MAX_BUDGET = 1_000_000  # more than any context window: a larger number is a mistake, not a budget
MAX_MESSAGE_CHARS = 300
HARMONY_TO_FINAL = "<|start|>assistant<|channel|>final<|message|>"
DRAFT_AND_BUDGET = ("--think-budget and --draft-model cannot go together: a draft's tokens are counted before they "
                    "are accepted, so the reasoning would be cut at the wrong token")
# ``reasoning_effort`` (OpenAI) and ``reasoning.effort`` (Responses) as budgets: ``high`` (and ``xhigh``) is
# the model's own length; the others cut where a small local model's reasoning of a chat turn is long.
EFFORT_BUDGETS: dict[str, int | None] = {"none": 0, "minimal": 0, "low": 256, "medium": 1024, "high": None,
                                         "xhigh": None}


@dataclass(frozen=True)
class ThinkBudget:
    """``tokens`` of reasoning at most; ``message``: said before the forced end (may be empty)."""

    tokens: int
    message: str = ""


def parse_budget(value: Any, what: str = "think budget") -> int | None:
    """A budget as a user or a request gives it: a whole number from 0 to ``MAX_BUDGET``; ``none``
    (or None) is no budget. Anything else is a ``ValueError`` with one clear line."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "off", "")):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"the {what} must be a whole number of tokens (0 to {MAX_BUDGET:,}) or none")
    text = str(value).strip()
    if not text.isascii() or not text.lstrip("-").isdigit():
        raise ValueError(f"the {what} must be a whole number of tokens (0 to {MAX_BUDGET:,}) or none, "
                         f"not {text[:40]!r}")
    number = int(text)
    if not 0 <= number <= MAX_BUDGET:
        raise ValueError(f"the {what} must be from 0 to {MAX_BUDGET:,} tokens, not {number:,}")
    return number


def budget_of_effort(effort: Any) -> ThinkBudget | None:
    """The budget an effort names (``EFFORT_BUDGETS``), or a ``ValueError`` for one it does not."""
    if not isinstance(effort, str) or effort not in EFFORT_BUDGETS:
        raise ValueError(f"reasoning effort must be one of {', '.join(EFFORT_BUDGETS)}, not {str(effort)[:40]!r}")
    tokens = EFFORT_BUDGETS[effort]
    return ThinkBudget(tokens=tokens) if tokens is not None else None


def checked_message(value: Any) -> str:
    """A closing sentence as a request gives it: text of at most ``MAX_MESSAGE_CHARS``, no control characters."""
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > MAX_MESSAGE_CHARS or not value.replace("\n", " ").isprintable():
        raise ValueError(f"the think budget's message must be printable text of at most {MAX_MESSAGE_CHARS} "
                         "characters")
    return value


def forced_ending(fmt: ReasoningFormat, message: str) -> str:
    """The text forced at the budget: the closing sentence, then the family's own end of reasoning
    (``</think>``; harmony's end of the analysis channel and the head of the final one)."""
    said = message if not message.strip() or message.endswith("\n") else f"{message}\n"  # (as the user spaced it)
    if fmt.name == "harmony":
        return f"{said}{fmt.close_marker}{HARMONY_TO_FINAL}"
    return f"{said}{fmt.close_marker}"


class ReasoningCounter:
    """Generated token ids from the open marker to the close marker, both included."""

    def __init__(self, start: tuple[int, ...], end: tuple[int, ...], inside: bool):
        self.start, self.end = start, end
        self.inside, self.count = inside, 0
        self.recent: list[int] = []

    def add(self, token: int) -> None:
        self.recent = (self.recent + [token])[-max(len(self.start), len(self.end)):]
        if self.inside:
            self.count += 1
            self.inside = not self._ends_with(self.end)
        elif self._ends_with(self.start):
            self.inside, self.count = True, self.count + len(self.start)

    def _ends_with(self, marker: tuple[int, ...]) -> bool:
        return bool(marker) and tuple(self.recent[-len(marker):]) == marker


class BudgetedReasoning:
    """The logits processor of one reply. mlx_lm calls it once a sampled token, the context's last
    token being the one sampled before (the first call sees the prompt alone). Once the reasoning
    is over (ended by itself, or its forced end written), the answer's steps cost it nothing."""

    def __init__(self, budget: int, counter: ReasoningCounter, ending: tuple[int, ...]):
        self.budget, self.counter, self.ending = budget, counter, ending
        self.forcing: list[int] = []
        self.cut = False  # the reasoning reached the budget and its end was forced
        self._calls = 0
        self._entered = self._over = False

    def __call__(self, tokens: Any, logits: Any) -> Any:
        if self._over:
            return logits
        if self._calls:
            self.counter.add(int(tokens[-1].item()))
        self._calls += 1
        if self.counter.inside:
            self._entered = True
        elif self._entered and not self.forcing:
            self._over = True
            return logits
        if not self.cut and self.counter.inside and self.counter.count >= self.budget:
            self.forcing, self.cut = list(self.ending), True
        if self.forcing:
            return only(logits, self.forcing.pop(0))
        return logits


def only(logits: Any, token: int) -> Any:
    """``logits`` that every sampler turns into ``token``."""
    import mlx.core as mx

    keep = mx.arange(logits.shape[-1]) == token
    return mx.where(keep, mx.zeros_like(logits), mx.array(-float("inf"), dtype=logits.dtype))


def budgeted(budget: ThinkBudget | None, fmt: ReasoningFormat | None, tokenizer: Any,
             opened: bool) -> BudgetedReasoning | None:
    """The reply's processor, or None: no budget, or a model that does not reason."""
    if budget is None or fmt is None:
        return None
    encode = lambda text: tuple(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    counter = ReasoningCounter(encode(fmt.open_marker), encode(fmt.close_marker), inside=opened)
    return BudgetedReasoning(budget.tokens, counter, encode(forced_ending(fmt, budget.message)))
