"""How long an idle model stays loaded, written as ollama's ``keep_alive`` takes it: ``5m``,
``30s``, ``1h30m``, a number of seconds, ``0`` (unload after each reply), ``never`` (or a negative
number, as ollama takes ``-1``). ``None`` is never."""

from __future__ import annotations

import math
import re

from localchat.errors import UsageError

DEFAULT = "5m"
NEVER_WORDS = ("never", "forever", "inf")
UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
MAX_S = 10 * 365 * 86400.0  # past ten years, "never" is meant


def parse_keep_alive(value: object) -> float | None:
    """Seconds an idle model is kept, or None for never; anything else is one usage line."""
    if isinstance(value, bool):
        raise UsageError(f"invalid keep-alive {value!r}: use a duration such as 5m, 30s, 0 or never")
    if isinstance(value, (int, float)):
        return _seconds(float(value), value)
    if not isinstance(value, str):
        raise UsageError(f"invalid keep-alive {value!r}: use a duration such as 5m, 30s, 0 or never")
    text = value.strip().lower()
    if text in NEVER_WORDS:
        return None
    try:
        return _seconds(float(text), value)
    except ValueError:
        pass
    parts = PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        shown = value if len(value) <= 40 else value[:40] + "…"
        raise UsageError(f"invalid keep-alive {shown!r}: use a duration such as 5m, 30s, 1h, 0 or never")
    return _seconds(sum(float(n) * UNITS[u] for n, u in parts), value)


def _seconds(seconds: float, given: object) -> float | None:
    if math.isnan(seconds):
        raise UsageError(f"invalid keep-alive {given!r}: use a duration such as 5m, 30s, 0 or never")
    if seconds < 0 or seconds > MAX_S:
        return None
    return seconds


def shown(seconds: float | None) -> str:
    """A keep-alive as it is written back: ``never``, ``0s``, ``30s``, ``5m``, ``1h30m``."""
    if seconds is None:
        return "never"
    if seconds < 60 or seconds % 60:
        return f"{seconds:g}s"
    minutes = int(seconds // 60)
    return f"{minutes // 60}h{minutes % 60}m".replace("h0m", "h") if minutes >= 60 else f"{minutes}m"
