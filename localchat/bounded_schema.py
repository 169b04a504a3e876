"""Checking text against a pattern or a JSON Schema in bounded time.

Python's ``re``, which jsonschema uses, backtracks without limit: ``(a+)+b`` against forty ``a``
runs for hours, and a reply that stops short of its pattern (``--max-tokens``, a server that ignores
the format) or a tool's arguments against an MCP server's schema are exactly such texts. So
``--regex`` and a schema's ``pattern``, ``patternProperties`` and the ``additionalProperties``
beside them are tested with the ``regex`` module, which takes a timeout (and avoids most of that
backtracking to begin with), all of one check's tests sharing one deadline.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

CHECK_BUDGET_S = 2.0  # the most one check may take before what it checks is refused as uncheckable


class CheckTimeout(Exception):
    """A pattern took the whole budget on this text: the reply cannot be said to match."""


class Deadline:
    def __init__(self, budget_s: float = CHECK_BUDGET_S):
        self.at = time.monotonic() + budget_s

    def left(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise CheckTimeout
        return left

    def search(self, pattern: str, text: str) -> bool:
        import regex

        return self._within(regex.search, pattern, text)

    def fullmatch(self, pattern: str, text: str) -> bool:
        import regex

        return self._within(regex.fullmatch, pattern, text)

    def _within(self, match: Any, pattern: str, text: str) -> bool:
        try:
            return match(pattern, text, timeout=self.left()) is not None
        except TimeoutError:
            raise CheckTimeout from None


def schema_errors(schema: dict[str, Any], value: Any, deadline: Deadline, *, own_draft: bool = False,
                  formats: bool = False) -> Iterator[Any]:
    """jsonschema's Draft 2020-12 errors for ``value`` (``own_draft``: the draft its ``$schema``
    names, as ``jsonschema.validate`` reads it), its pattern keywords tested under ``deadline``
    (``CheckTimeout`` past it); ``formats`` checks ``format`` too (``email``, ``date``, ``ipv4``…:
    what jsonschema has a checker for), as the grammar enforces it in-process."""
    from jsonschema import Draft202012Validator, validators
    from jsonschema.exceptions import ValidationError

    def pattern(validator: Any, pattern: str, instance: Any, _schema: Any) -> Iterator[Any]:
        if validator.is_type(instance, "string") and not deadline.search(pattern, instance):
            yield ValidationError(f"{instance!r} does not match {pattern!r}")

    def pattern_properties(validator: Any, patterns: dict, instance: Any, _schema: Any) -> Iterator[Any]:
        if validator.is_type(instance, "object"):
            for each, subschema in patterns.items():
                for key, item in instance.items():
                    if deadline.search(each, key):
                        yield from validator.descend(item, subschema, path=key, schema_path=each)

    def additional_properties(validator: Any, extra: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if not validator.is_type(instance, "object"):
            return
        known, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
        extras = sorted(key for key in instance if key not in known
                        and not any(deadline.search(each, key) for each in patterns))
        if validator.is_type(extra, "object"):
            for key in extras:
                yield from validator.descend(instance[key], extra, path=key)
        elif not extra and extras:
            matching = f" (matching none of {', '.join(map(repr, patterns))})" if patterns else ""
            yield ValidationError(f"additional properties are not allowed: {', '.join(map(repr, extras))}{matching}")

    base = validators.validator_for(schema, default=Draft202012Validator) if own_draft else Draft202012Validator
    checked = validators.extend(base, {
        "pattern": pattern, "patternProperties": pattern_properties, "additionalProperties": additional_properties})
    return checked(schema, format_checker=base.FORMAT_CHECKER if formats else None).iter_errors(value)
