"""Tool results cut to fit the context window: every model call of a turn, each round of tool calls
included, passes the same budget as the user's question (``ChatSession.token_budget``).

When a round's results would push the next request past the budget, each result is cut to the
same number of characters, the most that fits, and says so to the model in its own text; the user
hears which results were cut. When even results cut to nothing do not fit, the turn ends there, in
one line, and nothing enters the history.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from localchat.conversation.history import ToolStep
from localchat.errors import LocalchatError

CUT_NOTE = "\n[… {cut:,} of its {total:,} characters were cut here: they did not fit the model's context window]"


class ContextOverflow(LocalchatError):
    """Even with every tool result cut to nothing, the next request would pass the budget."""


def capped(step: ToolStep, limit: int) -> ToolStep:
    """``step`` with every result longer than ``limit`` characters cut there, and saying so."""
    return replace(step, results=tuple(r if len(r) <= limit else r[:limit] + CUT_NOTE.format(cut=len(r) - limit,
                                                                                            total=len(r))
                                       for r in step.results))


def fit_results(step: ToolStep, tokens_of: Callable[[ToolStep], int | None], budget: int,
                limit: str) -> tuple[ToolStep, list[str]]:
    """The step as it can be sent (its results cut to the longest that fits ``budget`` tokens), and
    what to tell the user about each result that was cut. ``tokens_of`` counts the next request
    with a step in it; ``limit`` names the budget."""
    tokens = tokens_of(step)
    if tokens is None or tokens <= budget:
        return step, []
    least = tokens_of(capped(step, 0)) or 0
    if least > budget:
        raise ContextOverflow(f"the tool results do not fit: even cut to nothing, the next request would be {least} "
                              f"tokens, over {limit} ({budget}); the turn ends without an answer")
    low, high = 0, max(len(r) for r in step.results)  # the most characters a result may keep
    while low < high:
        middle = (low + high + 1) // 2
        if (tokens_of(capped(step, middle)) or 0) <= budget:
            low = middle
        else:
            high = middle - 1
    notices = [f"{call['name']}'s result was cut from {len(result):,} to {low:,} characters: whole, the next "
               f"request would be {tokens} tokens, over {limit} ({budget}); the model is told so"
               for call, result in zip(step.calls, step.results) if len(result) > low]
    return capped(step, low), notices
