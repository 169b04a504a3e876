"""A turn's rounds of tool calls as stored (JSON), read back checked whole."""

from __future__ import annotations

from typing import Any

from localchat.conversation.history import ToolStep


def tool_steps(data: Any) -> tuple[ToolStep, ...]:
    """Stored rounds of tool calls, checked whole: every call with an id, a name and its result
    (ValueError otherwise: a half-kept round must never reach a template)."""
    if not isinstance(data, list):
        raise ValueError("not a list")
    steps = []
    for raw in data:
        if not isinstance(raw, dict) or not isinstance(raw.get("text"), str) \
                or not isinstance(raw.get("reasoning", ""), str):
            raise ValueError("not a round")
        calls, results = raw.get("calls"), raw.get("results")
        if not isinstance(calls, list) or not isinstance(results, list) or not calls or len(calls) != len(results):
            raise ValueError("calls and results do not pair")
        if not all(isinstance(c, dict) and isinstance(c.get("id"), str) and isinstance(c.get("name"), str)
                   and isinstance(c.get("arguments"), (dict, str)) for c in calls) \
                or not all(isinstance(r, str) for r in results):
            raise ValueError("a call or a result is malformed")
        steps.append(ToolStep(raw["text"], tuple(calls), tuple(results), raw.get("reasoning", "")))
    return tuple(steps)
