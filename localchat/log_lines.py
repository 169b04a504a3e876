"""What a child's log says went wrong, in one line: the last line that reads as an error (a
Python exception, ``error:``, ``Caused by: …``), never the hint or the ordinary line after it."""

from __future__ import annotations

import re

EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b:?")
ERROR_WORDS = re.compile(r"\b(?:ERROR|CRITICAL|FATAL)\b|[Ee]rror:|\b(?:[Ff]ailed|[Cc]annot|[Uu]nable to)\b"
                         r"|^Caused by:")


def error_line(lines: list[str]) -> str:
    """The last error-looking line of ``lines`` (stripped); else the last line; "" for none."""
    lines = [line.strip() for line in lines if line.strip()]
    return next((line for line in reversed(lines) if is_error(line)), lines[-1] if lines else "")


def is_error(line: str) -> bool:
    return bool(EXCEPTION_LINE.match(line) or ERROR_WORDS.search(line))
