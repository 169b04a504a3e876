"""Reading the project's YAML files (models.yaml, bench scripts) with errors that name the line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from localchat.errors import LocalchatError
from localchat.files import read_text


def describe_yaml_error(exc: yaml.YAMLError) -> str:
    """``line 4: expected ',' or ']' (in the flow sequence started at line 3)``."""
    problem = str(getattr(exc, "problem", None) or exc).strip()
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}: " if mark else ""
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and start and (not mark or start.line != mark.line):
        problem += f" ({context.removeprefix('while parsing ')} started at line {start.line + 1})"
    return where + problem


def read_yaml(path: Path, error: type[LocalchatError] = LocalchatError) -> Any:
    try:
        text = read_text(path)
    except FileNotFoundError:
        raise error(f"{path} does not exist") from None
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise error(f"cannot read {path}: not UTF-8 text (byte {exc.start})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"{path}: {describe_yaml_error(exc)}") from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise error(f"{path}: nested too deep to read") from None
