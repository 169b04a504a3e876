"""How numbers read in what people are shown: ``1 turn``, ``2 turns``."""


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 message``, ``2 messages`` (``plural`` where adding an s is wrong: ``2 processes``)."""
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"


def ago(stamp: str) -> str:
    """How long ago a stored time (``2026-12-03 17:40:00``, local) was: ``3 min ago``, ``2 days ago``."""
    import time

    try:
        then = time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S"))
    except (TypeError, ValueError):
        return stamp or "?"
    seconds = max(0.0, time.time() - then)
    for size, unit in ((86400, "day"), (3600, "h"), (60, "min")):
        if seconds >= size:
            n = int(seconds // size)
            return f"{count(n, unit) if unit == 'day' else f'{n} {unit}'} ago"
    return "just now"


def run_as() -> str:
    """The command as the user ran it, for the hints that say what to type next: ``uv run localchat``
    under ``uv run``, ``python -m localchat`` when run so, else ``localchat``."""
    import os
    import sys

    if os.environ.get("UV_RUN_RECURSION_DEPTH"):
        return "uv run localchat"
    if sys.argv and sys.argv[0].endswith("__main__.py"):
        return "python -m localchat"
    return "localchat"
