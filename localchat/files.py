"""Writing a file whole or not at all: a temporary file beside it, synced, then renamed over it.

A full disk, a read-only directory or an interruption leaves the previous file (or none) in place,
never half of one, and no temporary file behind.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from localchat.errors import LocalchatError


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` atomically (``OSError`` on failure, nothing left behind)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_outputs(out: Path, texts: dict[str, str]) -> list[Path]:
    """Report files (``results.json``, ``summary.md`` …) in ``out``, each whole or not at all; a
    failure is one line saying which file was not written."""
    written = []
    for name, text in texts.items():
        path = out / name
        try:
            out.mkdir(parents=True, exist_ok=True)
            write_atomic(path, text.encode("utf-8"))
        except OSError as exc:
            done = f" ({', '.join(p.name for p in written)} written)" if written else ""
            raise LocalchatError(f"cannot write {path}: {exc.strerror or exc}{done}") from None
        written.append(path)
    return written
