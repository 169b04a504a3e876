"""``localchat import FILE.gguf``: convert, register, and say what was made."""

from __future__ import annotations

import re
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from localchat.cli import outcomes
from localchat.errors import UsageError
from localchat.gguf.convert import ImportReport, import_gguf
from localchat.store.home import home_dir

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def default_name(source: Path) -> str:
    """``SmolLM2-135M-Instruct.Q4_1.gguf`` → ``smollm2-135m-instruct-q4_1``."""
    stem = source.name.removesuffix(".gguf")
    return re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-._")[:64] or "imported"


def run_import(*, file: Path | None, name: str | None, from_ollama: str | None, console: Console,
               err: Console) -> int:
    from localchat.gguf.package import ollama_blob
    from localchat.store.user_models import add_user_model, check_free_name

    if (file is None) == (from_ollama is None):
        raise UsageError("give a GGUF file, or --from-ollama MODEL[:TAG] (one of the two)")
    source = ollama_blob(from_ollama) if from_ollama else file
    if not source.is_file():
        raise UsageError(f"{source} is not a file")
    name = name or (default_name(Path(from_ollama.replace(":", "-"))) if from_ollama else default_name(source))
    if not NAME.match(name):
        raise UsageError(f"invalid model name {name!r}: letters, digits, '.', '_' or '-' (at most 64)")
    check_free_name(name)
    destination = home_dir() / "models" / name
    if destination.exists():
        raise UsageError(f"{destination} exists already: remove it, or pick another --name")
    started = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as progress:
        task = progress.add_task(f"importing {source.name}", total=None)
        report = import_gguf(source, destination, on_progress=lambda done, total, tensor: progress.update(
            task, completed=done, total=total, description=f"importing {tensor}"))
    add_user_model(registry_entry(report, from_ollama))
    show_report(console, report, time.perf_counter() - started)
    return outcomes.OK


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
    console.print(f"chat with: localchat chat -m {report.name}", markup=False, overflow="ignore", crop=False)
