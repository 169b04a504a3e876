"""Where localchat keeps the user's things: the data directory and its optional config file.

``LOCALCHAT_HOME`` overrides the platform's user data directory (platformdirs), so tests and
users with several setups can keep them apart. ``config.yaml`` there may set ``records_dir``,
``cache_max_bytes``, ``log`` (false: conversations are kept only by /save) and ``memory_limit``
(what a model may take, checked before it loads).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from localchat.errors import UsageError
from localchat.yamlfile import read_yaml

CONFIG_KEYS = {"records_dir", "cache_max_bytes", "log", "memory_limit"}


def home_dir() -> Path:
    """The user's localchat directory; one that exists as a file is a usage error, named."""
    if override := os.environ.get("LOCALCHAT_HOME"):
        path = Path(override).expanduser()
        where = f"LOCALCHAT_HOME ({path})"
    else:
        from platformdirs import user_data_dir

        path = Path(user_data_dir("localchat", appauthor=False))
        where = f"localchat's data directory {path}"
    if path.exists() and not path.is_dir():
        raise UsageError(f"{where} is a file, not a directory: point LOCALCHAT_HOME at a directory")
    return path


def load_config() -> dict[str, Any]:
    """The config file's settings ({} when there is none); unknown keys are usage errors."""
    path = home_dir() / "config.yaml"
    if not path.is_file():
        return {}
    data = read_yaml(path, UsageError) or {}
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping such as 'records_dir: ~/chat-records'")
    unknown = set(data) - CONFIG_KEYS
    if unknown:
        raise UsageError(f"{path}: unknown setting '{sorted(unknown)[0]}' (known: {', '.join(sorted(CONFIG_KEYS))})")
    return data


def records_dir(option: Path | None) -> Path | None:
    """``--record DIR`` wins over the config's ``records_dir``. One that exists as something other
    than a directory is refused now, before the model loads (created only at the first record)."""
    configured = None if option is not None else load_config().get("records_dir")
    path = option if option is not None else Path(str(configured)).expanduser() if configured else None
    if path is not None and path.exists() and not path.is_dir():
        where = "--record" if option is not None else f"{home_dir() / 'config.yaml'}: records_dir"
        raise UsageError(f"{where} {path} is a file, not a directory")
    return path


def keeps_conversations(flag: bool) -> bool:
    """Whether conversations are kept as they happen: ``--no-log`` and ``log: false`` say no."""
    if not flag:
        return False
    configured = load_config().get("log", True)
    if not isinstance(configured, bool):
        raise UsageError(f"{home_dir() / 'config.yaml'}: log must be true or false, not {configured!r}")
    return configured
