"""Each request's thinking budget in the engine (``grammar.think_budget``): its processor, made when
the prompt is tokenized and kept by the request's generation arguments (the engine makes one list
of processors per request, in a batch too: each request's budget is its own), and what the reply's
usage says of it (``usage.think_budget``: the budget, and whether the reasoning was cut there)."""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

from localchat.grammar.think_budget import BudgetedReasoning, ThinkBudget, budgeted, parse_budget

BUDGET_ENV = "LOCALCHAT_THINK_BUDGET"  # serve --think-budget, for the engines it starts
MESSAGE_ENV = "LOCALCHAT_THINK_BUDGET_MESSAGE"


def default_budget() -> ThinkBudget | None:
    """``serve --think-budget`` (and its message), as serve passed them to this engine."""
    tokens = parse_budget(os.environ.get(BUDGET_ENV))
    return ThinkBudget(tokens=tokens, message=os.environ.get(MESSAGE_ENV, "")) if tokens is not None else None


class ReplyBudgets:
    """The processors, by generation arguments (for the engine's processor list) and by request (for
    the usage the handler writes); an entry goes when its arguments or its request do."""

    def __init__(self) -> None:
        self._by_args: dict[int, BudgetedReasoning] = {}
        self._by_request: dict[int, tuple[ThinkBudget, BudgetedReasoning | None]] = {}
        self._lock = threading.Lock()

    def put(self, args: Any, request: Any, budget: ThinkBudget, fmt: Any, tokenizer: Any, prompt: list[int]) -> None:
        from localchat.backends.reply import opens_reasoning

        processor = budgeted(budget, fmt, tokenizer, opens_reasoning(tokenizer, prompt, fmt))
        with self._lock:
            self._by_request[id(request)] = (budget, processor)
            if processor is not None:
                self._by_args[id(args)] = processor
        weakref.finalize(request, self._forget, self._by_request, id(request))
        weakref.finalize(args, self._forget, self._by_args, id(args))

    def for_args(self, args: Any) -> BudgetedReasoning | None:
        with self._lock:
            return self._by_args.get(id(args))

    def reported(self, response: dict[str, Any], request: Any) -> dict[str, Any]:
        """``response`` with ``usage.think_budget`` when the request had a budget."""
        with self._lock:
            held = self._by_request.get(id(request)) if request is not None else None
        usage = response.get("usage")
        if held is not None and isinstance(usage, dict):
            budget, processor = held
            usage["think_budget"] = {"tokens": budget.tokens, "cut": bool(processor and processor.cut)}
        return response

    def _forget(self, table: dict[int, Any], key: int) -> None:
        with self._lock:
            table.pop(key, None)
