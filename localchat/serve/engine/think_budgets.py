"""Each request's thinking budget in the engine (``grammar.think_budget``): its processor, made when
the prompt is tokenized and kept by the request's generation arguments (the engine makes one list
of processors per request, in a batch too: each request's budget is its own), and what the reply's
usage says of it (``usage.think_budget``: the budget, and whether the reasoning was cut there)."""

from __future__ import annotations

import os
from typing import Any

from localchat.grammar.think_budget import BudgetedReasoning, ThinkBudget, budgeted, parse_budget
from localchat.serve.engine.reply_masks import ByIdentity

BUDGET_ENV = "LOCALCHAT_THINK_BUDGET"  # serve --think-budget, for the engines it starts
MESSAGE_ENV = "LOCALCHAT_THINK_BUDGET_MESSAGE"


def default_budget() -> ThinkBudget | None:
    """``serve --think-budget`` (and its message), as serve passed them to this engine."""
    tokens = parse_budget(os.environ.get(BUDGET_ENV))
    return ThinkBudget(tokens=tokens, message=os.environ.get(MESSAGE_ENV, "")) if tokens is not None else None


class ReplyBudgets:
    """The processors, by generation arguments (for the engine's processor list) and by request (for
    the usage the handler writes)."""

    def __init__(self) -> None:
        self._by_args, self._by_request = ByIdentity(), ByIdentity()

    def put(self, args: Any, request: Any, budget: ThinkBudget, fmt: Any, tokenizer: Any, prompt: list[int]) -> None:
        from localchat.backends.reply import opens_reasoning

        processor = budgeted(budget, fmt, tokenizer, opens_reasoning(tokenizer, prompt, fmt))
        self._by_request.put(request, (budget, processor))
        self._by_args.put(args, processor)

    def for_args(self, args: Any) -> BudgetedReasoning | None:
        return self._by_args.of(args)

    def reported(self, response: dict[str, Any], request: Any) -> dict[str, Any]:
        """``response`` with ``usage.think_budget`` when the request had a budget."""
        held = self._by_request.of(request) if request is not None else None
        usage = response.get("usage")
        if held is not None and isinstance(usage, dict):
            budget, processor = held
            usage["think_budget"] = {"tokens": budget.tokens, "cut": bool(processor and processor.cut)}
        return response
