"""The user's own registry, ``$LOCALCHAT_HOME/models.yaml``: the models ``localchat import`` made.

Written whole and atomically (temporary file, then rename), so a crash never leaves half a file.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import yaml

from localchat.errors import UsageError
from localchat.registry import load_registry, read_registry_file, user_models_file

HEADER = "# Models imported by `localchat import`; laid over localchat's models.yaml.\n"


def check_free_name(name: str) -> None:
    for entry in load_registry():
        if name == entry.id or name in entry.aliases:
            raise UsageError(f"the name '{name}' is taken by a model already (see: localchat models); "
                             "pick another with --name")


def add_user_model(entry: dict[str, Any]) -> Path:
    path = user_models_file()
    entries = _raw_entries(path) + [entry]
    text = HEADER + yaml.safe_dump({"models": entries}, sort_keys=False, allow_unicode=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    read_registry_file(path)  # what was written must read back
    return path


def _raw_entries(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    read_registry_file(path)  # a damaged file is reported, never overwritten
    return yaml.safe_load(path.read_text(encoding="utf-8"))["models"]
