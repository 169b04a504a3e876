"""Where a bench or load run writes (``--out``, ``--plot``), checked before the run starts, not
after its last turn."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from localchat.errors import UsageError
from localchat.extras import install_hint


def check_outputs(opts: Any) -> None:
    """``opts.out`` and ``opts.plot`` (bench's options or load's) can be written."""
    if opts.out is not None:
        check_writable_directory(opts.out, "--out")
    if opts.plot is not None:
        check_plot_path(opts.plot)


def check_writable_directory(path: Path, option: str) -> None:
    """``path`` can be written, or made where the nearest directory that exists can be written; it
    is made only when the results are (a run refused later leaves no empty directory behind)."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path} is a file, not a directory")
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise UsageError(f"{option} {path}: {existing} is a file, not a directory")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise UsageError(f"{option} {path} cannot be written: {exc.strerror or exc}") from None


def check_plot_path(plot: Path) -> None:
    if plot.is_dir():
        raise UsageError(f"--plot {plot} is a directory: name the PNG file to write")
    if not plot.parent.is_dir():
        raise UsageError(f"--plot {plot}: the directory {plot.parent} does not exist")
    if not os.access(plot.parent, os.W_OK):
        raise UsageError(f"--plot {plot}: the directory {plot.parent} cannot be written")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError(f"--plot needs matplotlib: {install_hint('plot')}") from None
