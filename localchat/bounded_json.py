"""JSON from files, databases, servers and models, parsed with a cap on its nesting.

``json.loads`` recurses once a level and raises ``RecursionError`` past Python's limit (about a
thousand), which no reader expects. Here a text nested deeper than ``MAX_DEPTH`` is a ``ValueError``
like any other malformed JSON, so each reader's own one line ("… is not JSON: …") covers it.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 128  # far beyond any config, schema, session or call; far below Python's recursion limit
_STRUCTURE = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')  # a string (skipped whole), or a bracket


class TooDeep(ValueError):
    pass


def nesting(text: str) -> int:
    """How deep the brackets of ``text`` go, outside strings."""
    depth = deepest = 0
    for match in _STRUCTURE.finditer(text):
        bracket = match[0]
        if bracket in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif bracket in "]}":
            depth -= 1
    return deepest


def loads(text: str | bytes, *, strict: bool = False) -> Any:
    """``json.loads``, refusing a text nested more than ``MAX_DEPTH`` deep (``TooDeep``); ``strict``
    refuses ``NaN`` and ``Infinity`` too, which Python reads but JSON does not have (a reply that
    holds them is not JSON, whatever Python makes of it)."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8")
    if text.count("[") + text.count("{") > MAX_DEPTH and nesting(text) > MAX_DEPTH:
        raise TooDeep(f"nested more than {MAX_DEPTH} levels deep")
    try:
        return json.loads(text, parse_constant=_not_json) if strict else json.loads(text)
    except RecursionError:  # a nesting the scan did not see (it never should)
        raise TooDeep(f"nested too deep for Python's parser (over {MAX_DEPTH} levels)") from None


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON (JSON has no NaN or Infinity)")
