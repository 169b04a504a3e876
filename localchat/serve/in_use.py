"""Which models a running ``serve`` serves, kept where ``rm`` can see it: one small file a serve
(``serving/PID.json`` in the data directory, 0600), written when it starts and removed when it
stops; a file whose process is gone (a serve killed with SIGKILL) is ignored and removed."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from localchat.files import private_dirs, read_text, write_atomic
from localchat.home import home_dir
from localchat.processes import alive

DIR_NAME = "serving"


@dataclass(frozen=True)
class Serving:
    pid: int
    port: int
    models: tuple[str, ...]  # the locations of the models it serves (a path, a repo id)


def _directory() -> Path:
    return home_dir() / DIR_NAME


def mark(port: int, locations: list[str]) -> Path:
    """This serve's record, written as it starts (one that cannot be written only means ``rm``
    cannot tell); ``unmark`` removes it."""
    path = _directory() / f"{os.getpid()}.json"
    with contextlib.suppress(OSError):
        private_dirs(path.parent)
        write_atomic(path, json.dumps({"pid": os.getpid(), "port": port, "models": locations}).encode(), 0o600)
    return path


def unmark(path: Path) -> None:
    path.unlink(missing_ok=True)


def serving(location: str) -> list[Serving]:
    """The running serves that serve the model at ``location``."""
    found = []
    directory = _directory()
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            record = json.loads(read_text(path, 1 << 20))
            pid, port, models = int(record["pid"]), int(record["port"]), tuple(map(str, record["models"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not alive(pid):
            path.unlink(missing_ok=True)
            continue
        if location in models:
            found.append(Serving(pid=pid, port=port, models=models))
    return found
