"""The user's own registry, ``$LOCALCHAT_HOME/models.yaml``: the models ``localchat import`` made.

Written whole and atomically (temporary file, then rename), so a crash never leaves half a file,
and under a lock around its read-modify-write, so two imports at once cannot lose an entry.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from localchat.errors import LocalchatError, UsageError
from localchat.files import private_dirs, write_atomic
from localchat.registry import load_registry, read_registry_file, user_models_file

HEADER = "# Models imported by `localchat import`; laid over localchat's models.yaml.\n"


def check_free_name(name: str) -> None:
    for entry in load_registry():
        if name == entry.id or name in entry.aliases:
            raise UsageError(f"the name '{name}' is taken by a model already (see: localchat models); "
                             "pick another with --name")


@contextmanager
def registry_lock(path: Path) -> Iterator[None]:
    """Exclusive use of the user's registry while it is read, changed and written back."""
    try:
        private_dirs(path.parent)
        fd = os.open(path.with_name(".models.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise LocalchatError(f"cannot lock the model registry in {path.parent}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def add_user_model(entry: dict[str, Any]) -> Path:
    """Register ``entry``; its name is checked again under the lock (another import may have taken it)."""
    path = user_models_file()
    with registry_lock(path):
        check_free_name(entry["id"])
        entries = _raw_entries(path) + [entry]
        text = HEADER + yaml.safe_dump({"models": entries}, sort_keys=False, allow_unicode=True)
        _write_atomic(path, text)
    read_registry_file(path)  # what was written must read back
    return path


def remove_user_model(name: str) -> None:
    """Take ``name``'s entry out of the user's registry (under the lock); a name it does not hold
    is an error, so ``rm`` never removes a directory the registry still names."""
    path = user_models_file()
    with registry_lock(path):
        entries = _raw_entries(path)
        kept = [e for e in entries if e.get("id") != name]
        if len(kept) == len(entries):
            raise LocalchatError(f"{name} is not in {path}: nothing removed")
        _write_atomic(path, HEADER + yaml.safe_dump({"models": kept}, sort_keys=False, allow_unicode=True))


def _write_atomic(path: Path, text: str) -> None:
    try:
        write_atomic(path, text.encode("utf-8"))
    except OSError as exc:
        raise LocalchatError(f"cannot write the model registry {path}: {exc.strerror or exc}; "
                             "it was left as it was") from None


def _raw_entries(path: Path) -> list[dict[str, Any]]:
    if path.exists() and not path.is_file():
        raise LocalchatError(f"the model registry {path} is not a file: move it away")
    if not path.is_file():
        return []
    read_registry_file(path)  # a damaged file is reported, never overwritten
    return yaml.safe_load(path.read_text(encoding="utf-8"))["models"]
