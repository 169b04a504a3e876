"""What this machine can give a model: the user's limit, else Metal's recommended working set
(macOS), else the memory available now (Linux's ``MemAvailable``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from localchat.errors import UsageError

MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True)
class MemoryBudget:
    bytes: int
    source: str  # said beside the figure: where it came from


def parse_limit(text: str | int) -> int:
    """``12GB``, ``512MB`` (``sizes``: decimal units, binary ones by name); a limit of nothing is a
    usage error, not "fits nowhere"."""
    from localchat.sizes import parse_size

    value = parse_size(text, "memory limit")
    if value <= 0:
        raise UsageError("the memory limit must be more than 0 bytes")
    return value


def configured_limit() -> int | None:
    """``memory_limit`` in config.yaml, if set."""
    from localchat.home import home_dir, load_config

    value = load_config().get("memory_limit")
    if value is None:
        return None
    try:
        return parse_limit(value)
    except UsageError as exc:
        raise UsageError(f"{home_dir() / 'config.yaml'}: memory_limit: {exc}") from None


def _metal_working_set() -> int | None:
    import mlx.core as mx

    from localchat.environment import mlx_device

    if not mlx_device()[1]:
        return None
    value = mx.device_info().get("max_recommended_working_set_size")
    return int(value) if isinstance(value, int) and value > 0 else None


def _available_memory() -> int | None:
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def machine_budget(limit: int | None = None) -> MemoryBudget | None:
    """The budget a load is checked against; None when this machine says nothing of its memory."""
    limit = limit if limit is not None else configured_limit()
    if limit is not None:
        return MemoryBudget(bytes=limit, source="your memory limit")
    if (metal := _metal_working_set()) is not None:
        return MemoryBudget(bytes=metal, source="Metal's recommended working set")
    if (available := _available_memory()) is not None:
        return MemoryBudget(bytes=available, source="memory available now")
    return None
