"""How numbers read in what people are shown: ``1 turn``, ``2 turns``."""


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 message``, ``2 messages`` (``plural`` where adding an s is wrong: ``2 processes``)."""
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"
