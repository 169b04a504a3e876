"""An example tool file: ``localchat chat --tools examples/tools/add.py``."""


def add(a: int, b: int) -> int:
    """Add two whole numbers and return their sum.

    Args:
        a: the first number
        b: the second number
    """
    return a + b
