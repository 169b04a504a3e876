"""The download itself, in a process of its own so that Ctrl+C stops it at once (the Hub
client's transfers do not stop when asked): ``python -m localchat.pull.fetch`` with the plan's JSON
on its standard input.

Each file goes through ``hf_hub_download`` into the Hugging Face cache at the plan's commit, so
the cache is the client's own and what finished stays. Progress and the end are JSON lines on
stdout: ``{"file", "bytes"}`` as bytes arrive, ``{"done"}`` per file, ``{"error"}`` once. A
file whose sha256 is not the one the Hub gave is removed from the cache and named.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

EVERY_S = 0.1


def emit(**fields) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


class Reporter:
    """What ``hf_hub_download`` takes as its progress bar (``tqdm_class``, bound to the file's name
    with ``functools.partial``): it counts bytes and emits them, at most every 0.1 s."""

    def __init__(self, name: str, total: int | None = None, initial: int = 0, **_kwargs) -> None:
        self.name = name
        self.n = initial
        self.sent = 0.0

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self.sent >= EVERY_S:
            self.sent = time.monotonic()
            emit(file=self.name, bytes=self.n)

    def close(self) -> None:
        emit(file=self.name, bytes=self.n)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _drop(pointer: Path) -> None:
    """A file that failed its checksum leaves the cache: its blob and its snapshot link."""
    blob = pointer.resolve()
    pointer.unlink(missing_ok=True)
    blob.unlink(missing_ok=True)


def fetch_one(repo: str, revision: str, name: str, sha256: str | None, first: bool = False) -> None:
    """The first file is asked for at ``main`` so that the client records which commit ``main`` is
    (what loading by name reads); it must be the plan's commit, the others are fetched at it."""
    from huggingface_hub import hf_hub_download

    progress: Any = functools.partial(Reporter, name)  # (what the client takes as its tqdm class)
    path = Path(hf_hub_download(repo, name, revision="main" if first else revision, tqdm_class=progress))
    if first and revision not in path.parts:
        raise ValueError(f"{repo} changed on the Hub while it was being pulled: run the pull again")
    if sha256 is not None and sha256_of(path) != sha256:
        _drop(path)
        raise ValueError(f"{name} does not match the checksum the Hub gave (sha256 {sha256[:12]}…): "
                         "removed; the download was corrupted on the way")
    emit(done=name)


def main() -> int:
    plan = json.loads(sys.stdin.read())
    os.environ.pop("HF_HUB_OFFLINE", None)
    from huggingface_hub.utils import logging as hub_logging

    hub_logging.set_verbosity_error()  # its retries are its own business; a failure comes back as one line
    try:
        for index, (name, sha256) in enumerate(plan["files"]):
            fetch_one(plan["repo"], plan["revision"], name, sha256, first=index == 0)
    except Exception as exc:  # the parent prints it as one line
        from localchat.pull.plan import hub_error

        message = str(exc) if isinstance(exc, ValueError) else str(hub_error(plan["repo"], exc))
        emit(error=(message.strip().splitlines() or [type(exc).__name__])[0])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
