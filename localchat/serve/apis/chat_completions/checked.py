"""A chat-completions (or completions) body as the front checks it before any engine sees it: JSON
within its bounds (nesting, NaN and Infinity refused), an object, its ``model`` a string, its
messages a list, and its sampling values of the type and range the engine can take; every refusal a
400 in OpenAI's error shape naming the parameter (the engine's own answers to these are a 500, a
dropped connection, or an error shape of its own)."""

from __future__ import annotations

import math
from typing import Any

from localchat import bounded_json
from localchat.serve.request import invalid

# name → (kind, lowest, highest, whether the lowest is allowed)
NUMBERS: dict[str, tuple[type, float, float, bool]] = {
    "temperature": (float, 0.0, 1e6, True),
    "top_p": (float, 0.0, 1.0, False),
    "min_p": (float, 0.0, 1.0, True),
    "top_k": (int, 0, 2**31, True),
    "max_tokens": (int, 1, 2**31, True),
    "max_completion_tokens": (int, 1, 2**31, True),
    "presence_penalty": (float, -2.0, 2.0, True),
    "frequency_penalty": (float, -2.0, 2.0, True),
    "repetition_penalty": (float, 0.0, 1e6, False),
    "seed": (int, -(2**63), 2**63 - 1, True),
    "n": (int, 1, 1, True),
    "logprobs": (int, 0, 20, True),
    "top_logprobs": (int, 0, 20, True),
}
FLAGS = ("stream",)


def checked_body(raw: bytes, messages_field: str = "messages") -> dict[str, Any]:
    """The body, parsed once and checked (``ApiError`` 400 naming the parameter otherwise)."""
    try:
        body = bounded_json.loads(raw, strict=True)
    except UnicodeDecodeError:
        raise invalid("the body is not UTF-8 text") from None
    except bounded_json.TooDeep as exc:
        raise invalid(f"the body is {exc}", deepest_field(raw)) from None
    except ValueError as exc:
        raise invalid(f"the body is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(body, dict):
        raise invalid("the body must be a JSON object")
    if "model" in body and not isinstance(body["model"], str):
        raise invalid("model must be a string: a model this server serves (GET /v1/models lists them)", "model")
    kinds = (list,) if messages_field == "messages" else (list, str)  # (a completion's prompt may be text)
    if messages_field in body and not isinstance(body[messages_field], kinds):
        raise invalid(f"{messages_field} must be a list" + (" or a string" if str in kinds else ""), messages_field)
    for name in FLAGS:
        if name in body and body[name] is not None and not isinstance(body[name], bool):
            raise invalid(f"{name} must be true or false", name)
    for name, rule in NUMBERS.items():
        if name in body and body[name] is not None and not (name == "logprobs" and isinstance(body[name], bool)):
            _number(name, body[name], *rule)
    return body


def deepest_field(raw: bytes) -> str | None:
    """The top-level field that nests deepest in a body too deep to take (a schema, tools), when
    Python's own parser can still read it; None otherwise."""
    import json

    try:
        body = json.loads(raw)
    except (RecursionError, ValueError):
        return None
    if not isinstance(body, dict) or not body:
        return None
    return max(body, key=lambda name: _depth(body[name]))


def _depth(value: Any) -> int:
    deepest, waiting = 0, [(value, 1)]
    while waiting:
        item, level = waiting.pop()
        deepest = max(deepest, level)
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        waiting.extend((child, level + 1) for child in children)
    return deepest


def _number(name: str, value: Any, kind: type, low: float, high: float, low_allowed: bool) -> None:
    shown = f"an integer from {low:g} to {high:g}" if kind is int else \
        f"a number {'from' if low_allowed else 'above'} {low:g} to {high:g}"
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not is_number or (kind is int and not isinstance(value, int)) or not math.isfinite(value) or \
            not (low <= value <= high) or (value == low and not low_allowed):
        raise invalid(f"{name} must be {shown}, not {str(value)[:40]!r}", name)
