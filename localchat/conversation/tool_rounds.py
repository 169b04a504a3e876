"""A turn with tools: the model is called, its calls are run and their results sent back, until it
answers (or ``--max-tool-rounds`` is reached).

Each round is a model call like any other (``ChatSession.call``: recorded, timed on the one clock,
judged); the time spent inside the tools is counted apart and never as model time. A round's
calls and their results become one ``ToolStep`` of the turn, and the turn is committed whole once
its answer is accepted, so the history never holds a call without its result. Ctrl+C or an error
while tools run ends the turn as if it had never started.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from localchat.backends import Message
from localchat.conversation.history import ToolStep
from localchat.conversation.result import Listeners, TurnResult, TurnStatus
from localchat.conversation.result_cuts import ContextOverflow
from localchat.conversation.stats import Ledger, TurnClock
from localchat.errors import TerminationRequested
from localchat.tools.runner import ToolRunner

Call = Callable[[list[Message], TurnClock], TurnResult]  # one model round: the messages sent, its clock
Fit = Callable[[list[Message], ToolStep], tuple[ToolStep, list[str]]]  # the context guard (``result_cuts``)


def answer_with_tools(call: Call, runner: ToolRunner, messages: list[Message], listeners: Listeners, *,
                      clock: TurnClock, ledger: Ledger, reasoning_field: str | None, fit: Fit) -> TurnResult:
    """The turn's last round, with the earlier rounds' steps and figures. Each round's results pass
    ``fit`` before the next call: cut to what fits the context, or the turn ends there."""
    steps: list[ToolStep] = []
    rounds, tool_s, sent = [], 0.0, messages
    while True:
        result = call(sent, clock)
        if not result.tool_calls or result.status is not TurnStatus.COMMITTED:
            break
        if len(steps) == runner.max_rounds:
            result = replace(result, status=TurnStatus.ERROR, error=f"the model still called tools after "
                             f"{runner.max_rounds} rounds (--max-tool-rounds): the turn ends without an answer")
            break
        listeners.on_round(result)
        try:
            step, seconds = _run_calls(runner, result, listeners)
            step, notices = fit(sent, step)
        except TerminationRequested:
            raise
        except KeyboardInterrupt:
            result = replace(result, status=TurnStatus.INTERRUPTED)
            break
        except ContextOverflow as exc:
            result = replace(result, status=TurnStatus.ERROR, error=str(exc))
            break
        for notice in notices:
            listeners.on_notice(notice)
        ledger.add_tools(len(step.calls), seconds)
        steps.append(step)
        rounds.append(result.stats)
        tool_s += seconds
        sent = [*sent, *step.messages(reasoning_field)]
        clock = TurnClock()
    return replace(result, messages=messages, steps=tuple(steps), rounds=tuple(rounds), tool_s=tool_s)


def _run_calls(runner: ToolRunner, result: TurnResult, listeners: Listeners) -> tuple[ToolStep, float]:
    """Run a round's calls in order; the step they make and the seconds spent inside the tools."""
    done = []
    for call in result.tool_calls:
        outcome = runner.run(call)
        listeners.on_tool_result(outcome)
        done.append(outcome)
    calls = tuple({"id": d.call.id, "name": d.call.name, "arguments": d.arguments} for d in done)
    step = ToolStep(text=result.text, calls=calls, results=tuple(d.content for d in done), reasoning=result.reasoning)
    return step, sum(d.seconds for d in done)
