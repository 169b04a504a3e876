"""``localchat import FILE.gguf``: convert, register, and say what was made."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from localchat.cli import outcomes
from localchat.errors import UsageError, raise_on_sigterm
from localchat.gguf.convert import ImportReport, import_gguf
from localchat.home import home_dir
from localchat.wording import run_as

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # whole names only: fullmatch


def default_name(source: Path) -> str:
    """``SmolLM2-135M-Instruct.Q4_1.gguf`` → ``smollm2-135m-instruct-q4_1``."""
    stem = source.name.removesuffix(".gguf")
    return re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-._")[:64] or "imported"


def run_import(*, file: Path | None, name: str | None, from_ollama: str | None, console: Console,
               err: Console) -> int:
    """Convert, then register; a registry that cannot be written takes the new directory away
    again, and Ctrl+C or SIGTERM leave nothing behind (the staging directory is removed)."""
    from localchat.gguf.package import ollama_blob
    from localchat.store.user_models import add_user_model, check_free_name

    if (file is None) == (from_ollama is None):
        raise UsageError("give a GGUF file, or --from-ollama MODEL[:TAG] (one of the two)")
    source = ollama_blob(from_ollama) if from_ollama is not None else file
    if source is None or not source.is_file():
        raise UsageError(f"{source} is not a file")
    name = checked_name(name, default_name(Path(from_ollama.replace(":", "-"))) if from_ollama is not None
                        else default_name(source))
    check_free_name(name)
    destination = home_dir() / "models" / name
    if destination.exists():
        raise UsageError(f"{destination} exists already: remove it, or pick another --name")
    raise_on_sigterm()
    started = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as progress:
        task = progress.add_task(f"importing {source.name}", total=None)
        report = import_gguf(source, destination, on_progress=lambda done, total, tensor: progress.update(
            task, completed=done, total=total, description=f"importing {tensor}"))
    try:
        add_user_model(registry_entry(report, from_ollama))
    except BaseException:
        shutil.rmtree(destination, ignore_errors=True)  # never a model directory the registry does not know
        raise
    show_report(console, report, time.perf_counter() - started)
    return outcomes.OK


def checked_name(given: str | None, default: str) -> str:
    """``--name`` as given (never silently replaced), or the file's name; one path component."""
    name = default if given is None else given
    if not NAME.fullmatch(name):
        raise UsageError(f"invalid model name {name!r}: letters, digits, '.', '_' or '-', starting with a "
                         "letter or digit (at most 64)")
    return name


def registry_entry(report: ImportReport, from_ollama: str | None) -> dict:
    types = ", ".join(f"{kind}×{n}" for kind, n in sorted(report.tensor_types.items()))
    origin = f"ollama {from_ollama}" if from_ollama else report.source.name
    return {"id": report.name, "source": str(report.directory),
            "description": f"{report.architecture}, {report.parameters / 1e6:.1f}M parameters, imported from {origin}",
            "imported": {"file": str(report.source), "tensor_types": types, "bits": report.bits,
                         "max_error": report.max_error or None}}


def show_report(console: Console, report: ImportReport, seconds: float) -> None:
    types = ", ".join(f"{kind}×{n}" for kind, n in sorted(report.tensor_types.items()))
    console.print(f"imported [bold]{report.name}[/bold]: {report.architecture}, {report.parameters / 1e6:.1f}M "
                  f"parameters ({types}), {report.size_bytes / 1e6:.1f} MB in {report.directory}, {seconds:.1f}s")
    for tensor, error in report.max_error.items():
        console.print(f"[yellow]{tensor}: stored as 8-bit groups of 32 (MLX has no groups of 16); largest "
                      f"error {error:.3g}[/yellow]")
    console.print(f"chat with: {run_as()} chat -m {report.name}", markup=False, overflow="ignore", crop=False)
