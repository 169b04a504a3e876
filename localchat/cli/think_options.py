"""The thinking budget's options (``--think-budget N``, ``--think-budget-message``) of chat and serve."""

from __future__ import annotations

from typing import Annotated, Optional

import typer


def check_think_budget(value: str | None) -> str | None:
    from localchat.grammar.think_budget import parse_budget

    try:
        parse_budget(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    return value


def budget_tokens(value: str | None) -> int | None:
    """``--think-budget`` as checked by its callback: tokens, or None (none given, or ``none``)."""
    from localchat.grammar.think_budget import parse_budget

    return parse_budget(value)


ThinkBudgetOpt = Annotated[Optional[str], typer.Option(
    callback=check_think_budget, metavar="N", show_default=False,
    help="A thinking model reasons at most N tokens, then its end of reasoning is forced and it answers "
         "[default: none].")]
ThinkBudgetMessageOpt = Annotated[str, typer.Option(
    metavar="TEXT", help="Said before the forced end of reasoning (e.g. \"Time to answer.\").")]
