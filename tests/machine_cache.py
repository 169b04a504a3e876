"""What tests build once per machine (imported and scripted models), shared safely between runs."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def machine_cache(name: str) -> Iterator[Path]:
    """A directory under ~/.cache/localchat-tests that tests build once per machine, held under a
    lock: pytest-xdist's workers (and several runs) wait for the one building it."""
    root = Path.home() / ".cache" / "localchat-tests"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield root / name
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
