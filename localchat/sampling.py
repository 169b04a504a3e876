"""The sampling settings a user can change, each checked one way wherever it comes from: a flag,
``/set`` in the REPL, or a model's defaults in models.yaml.

They map onto mlx_lm's own helpers (``make_sampler``: temperature, top_p, top_k, min_p;
``make_logits_processors``: repetition_penalty) in-process, and onto the request fields
mlx_lm.server reads per request over HTTP.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localchat.errors import UsageError


@dataclass(frozen=True)
class Setting:
    kind: type  # int or float
    valid: Callable[[Any], bool]
    rule: str  # what a valid value is, for the one-line error


def _finite(check: Callable[[float], bool]) -> Callable[[float], bool]:
    return lambda v: math.isfinite(v) and check(v)


SETTINGS: dict[str, Setting] = {
    "temperature": Setting(float, _finite(lambda v: v >= 0), "a finite number ≥ 0 (0: greedy)"),
    "top_p": Setting(float, _finite(lambda v: 0 < v <= 1), "a number in (0, 1] (1: off)"),
    "top_k": Setting(int, lambda v: 0 <= v <= 1_000_000, "a whole number ≥ 0 (0: off)"),
    "min_p": Setting(float, _finite(lambda v: 0 <= v < 1), "a number in [0, 1) (0: off)"),
    "repetition_penalty": Setting(float, _finite(lambda v: 0 < v <= 100), "a number in (0, 100] (1: off)"),
    "max_tokens": Setting(int, lambda v: 1 <= v <= 10_000_000, "a whole number ≥ 1"),
}


def check_setting(name: str, value: Any) -> Any:
    """``value`` when it is valid for ``name``, else a one-line UsageError saying what is."""
    setting = SETTINGS[name]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or (setting.kind is int and not isinstance(value, int)) or not setting.valid(value):
        raise UsageError(f"{name} must be {setting.rule}, not {value!r}")
    return setting.kind(value)


def parse_setting(name: str, text: str) -> Any:
    """A value typed as text (``/set top_k 40``), converted and checked."""
    if name not in SETTINGS:
        raise UsageError(f"unknown setting {name!r}: one of {', '.join(SETTINGS)}")
    setting = SETTINGS[name]
    try:
        value = setting.kind(text.strip()) if text.strip().isascii() else None
    except ValueError:
        value = None
    if value is None:
        raise UsageError(f"{name} must be {setting.rule}, not {text.strip()!r}")
    return check_setting(name, value)
