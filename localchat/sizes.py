"""Sizes as people write and read them, one convention everywhere (memory, disk, pull, rm, doctor,
models, ps): decimal units as the Hub, macOS and disk makers count (``1 GB`` is 10⁹ bytes, ``20MB``
is 20,000,000 bytes), binary ones only when named (``20MiB``, ``4GiB``). A number without a unit is
refused, since ``12`` could mean anything, except ``0``, which is nothing in any unit."""

from __future__ import annotations

import math
import re

from localchat.errors import UsageError

UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
         "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}
SIZE = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*([KMGT]I?)?(B?)\s*", re.IGNORECASE)
MAX_BYTES = 2**63 - 1
TAKES = "B, KB, MB, GB or TB (KiB, MiB, GiB for powers of 1024), e.g. 12GB or 500MB"


def parse_size(text: str | int, what: str = "size") -> int:
    """``12GB``, ``500MB``, ``1.5GiB``, ``123456B`` or ``0``; a bare number, or a size past what a
    machine has, is one usage line naming the units it takes."""
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise UsageError(f"invalid {what} {text!r}: use {TAKES}")
    shown = str(text) if len(str(text)) <= 40 else str(text)[:40] + "…"
    match = SIZE.fullmatch(str(text))
    if not match:
        raise UsageError(f"invalid {what} {shown!r}: use {TAKES}")
    number, unit, byte = match[1], (match[2] or "").upper(), match[3]
    if not unit and not byte:
        if float(number) == 0:
            return 0
        raise UsageError(f"{what} {shown!r} has no unit: use {TAKES}")
    value = float(number) * UNITS[unit]
    if not math.isfinite(value) or value > MAX_BYTES:
        raise UsageError(f"{what} {shown!r} is larger than any machine's: use {TAKES}")
    return int(value)


def shown_size(n: float | None) -> str:
    """A size as people read one, in the same decimal units: ``1.07 GB``, ``52.4 MB``, ``49 KB``."""
    if n is None:
        return "–"
    if n >= 1e12:
        return f"{n / 1e12:.2f} TB"
    if n >= 1e9:
        return f"{n / 1e9:.2f} GB" if n < 1e10 else f"{n / 1e9:.1f} GB"
    if n >= 1e6:
        return f"{n / 1e6:.1f} MB"
    return f"{n / 1e3:.0f} KB" if n >= 1e3 else f"{n:.0f} B"
