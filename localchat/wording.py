"""How numbers read in what people are shown: ``1 turn``, ``2 turns``."""


def count(n: int, noun: str) -> str:
    """``1 message``, ``2 messages``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
