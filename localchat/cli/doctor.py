"""``localchat doctor`` and ``localchat models``: what this machine has, shown honestly."""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table

from localchat.environment import collect
from localchat.errors import LocalchatError
from localchat.registry import describe, directory_size, load_registry, models_file, quantization_bits
from localchat.sizes import shown_size


def fit_text(name: str, budget) -> str:
    """What a present model needs at 8k tokens of context (or its window) and the verdict here."""
    from localchat.fit.check import on_metal
    from localchat.fit.shape import local_shape
    from localchat.fit.verdict import judge
    from localchat.registry import local_dir, resolve

    try:
        report = judge(local_shape(local_dir(resolve(name))), budget, metal=on_metal())
    except LocalchatError as exc:
        return f"no estimate ({exc})"
    return f"needs ~{shown_size(report.estimate.total)} at {report.estimate.context:,} tokens: {report.verdict}"


def how_to_get(entry) -> str:
    from localchat.cli.pull import how_it_arrives
    from localchat.registry import resolve

    ref = resolve(entry.id)
    return f"localchat pull {entry.id}" if ref.kind == "hub" else how_it_arrives(ref)


def show_model_list(console: Console) -> None:
    """One entry a block, so that ids and sources are never cut at any width (the console
    soft-wraps: a long line wraps on the terminal, not in the text)."""
    from localchat.fit.budget import machine_budget

    budget = machine_budget()
    entries = load_registry()
    for info in map(describe, entries):
        e = info.entry
        aliases = f" ({', '.join(e.aliases)})" if e.aliases else ""
        figures = " · ".join(
            [
                *([f"{e.family} family"] if e.family else []),
                "present" if info.present else "not on this machine",
                *([shown_size(info.size_bytes)] if info.present else []),
                *([f"{info.bits}-bit"] if info.bits else []),
                *([fit_text(e.id, budget)] if info.present else [how_to_get(e)]),
            ]
        )
        console.print(f"[bold]{escape(e.id)}[/bold]{escape(aliases)} · {figures}")
        console.print(f"  {e.source}" + (f" (variants: {', '.join(e.variants)})" if e.variants else ""),
                      style="dim", markup=False)
        if e.description:
            console.print(f"  {e.description}", markup=False)
        if e.imported:
            console.print(f"  from {e.imported.get('file')} ({e.imported.get('tensor_types')})", style="dim",
                          markup=False)
    for repo, path in pulled_elsewhere(entries):
        figures = " · ".join(["pulled, not in models.yaml", shown_size(directory_size(path)),
                              *([f"{bits}-bit"] if (bits := quantization_bits(path)) else []), fit_text(repo, budget)])
        console.print(f"[bold]{escape(repo)}[/bold] · {escape(figures)}")
        console.print(f"  {path}", style="dim", markup=False)


def pulled_elsewhere(entries) -> list[tuple[str, Path]]:
    """Model repos in the Hugging Face cache that no models.yaml entry names (pulled by repo id),
    each with its snapshot: what ``chat -m ORG/NAME`` and ``rm ORG/NAME`` take."""
    from huggingface_hub import scan_cache_dir

    from localchat.registry import hub_snapshot

    named = {e.source for e in entries} | {repo for e in entries for repo in e.variants.values()}
    try:
        repos = scan_cache_dir().repos
    except Exception:  # no cache yet, or one the client cannot read: nothing to add
        return []
    found = []
    for repo in sorted(repos, key=lambda r: r.repo_id):
        snapshot = hub_snapshot(repo.repo_id) if repo.repo_type == "model" and repo.repo_id not in named else None
        if snapshot is not None and (snapshot / "config.json").is_file():
            found.append((repo.repo_id, snapshot))
    return found


def show_models(console: Console) -> None:
    show_model_list(console)
    console.print(f"registry: {models_file()}", style="dim", markup=False)


def server_answers(base_url: str) -> str:
    import httpx

    from localchat.backends.http import shared_ssl_context

    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        response = httpx.get(f"{root}/health", timeout=1.0, verify=shared_ssl_context())
    except httpx.HTTPError as exc:
        return f"nothing answers at {root} ({type(exc).__name__})"
    return f"{root}/health answered HTTP {response.status_code}"


def distributed_backends() -> str:
    """Which of mlx.launch's backends this MLX build can start (``serve --ranks/--hostfile``)."""
    import mlx.core as mx

    from localchat.server.distributed import BACKENDS

    have = [b for b in BACKENDS if mx.distributed.is_available(backend=b)]
    missing = [b for b in BACKENDS if b not in have]
    return f"{', '.join(have) or 'none'} available" + (f"; not in this build: {', '.join(missing)}" if missing else "")


def config_text() -> tuple[bool, str]:
    """The config file, where it is (on a Mac: ~/Library/Application Support/localchat/), and
    whether it reads: doctor is the tool for diagnosing a bad one, so it runs whatever the file holds."""
    from localchat.errors import LocalchatError
    from localchat.home import home_dir, load_config

    try:
        path = home_dir() / "config.yaml"
    except LocalchatError as exc:
        return False, f"no data directory: {exc}"
    if not path.exists():
        return True, f"none ({path} may set records_dir, cache_max_bytes, log, memory_limit)"
    try:
        settings = load_config()
    except LocalchatError as exc:
        return False, f"NOT READ: {exc}"
    return True, f"{path}: {', '.join(sorted(settings)) or 'no settings'}"


def budget_text() -> str:
    """What a model may take here, and where that figure comes from."""
    from localchat.fit.budget import machine_budget

    budget = machine_budget()
    if budget is None:
        return "unknown (this machine does not say)"
    return f"{shown_size(budget.bytes)} ({budget.source}; memory_limit in config.yaml or --memory-limit to keep room)"


def prompt_cache_text() -> str:
    """serve's disk tier in its default place: its size and how often it was read."""
    from localchat.store.prompt_files import PromptFiles, default_root

    files = PromptFiles(default_root())
    return f"{shown_size(files.total_bytes())} on disk, {files.hits()} served from disk ({files.root})"


def run_doctor(console: Console, base_url: str) -> int:
    from huggingface_hub import constants

    env = collect()
    table = Table("check", Column("value", overflow="fold"), show_header=False)
    table.add_row("python", env.python)
    table.add_row("os", f"{env.os} ({env.machine})")
    table.add_row("chip", env.chip + ("" if env.apple_silicon else " (not Apple Silicon)"))
    table.add_row("mlx device", f"{env.mlx_device} (Metal {'available' if env.metal_available else 'not available'})")
    table.add_row("mlx / mlx-lm", f"{env.mlx_version} / {env.mlx_lm_version}")
    table.add_row("distributed", distributed_backends())
    table.add_row("localchat", env.localchat_version + (f" ({env.git_commit})" if env.git_commit else ""))
    table.add_row("HF cache", str(constants.HF_HUB_CACHE))
    config_ok, config_line = config_text()
    table.add_row("config.yaml", config_line)
    try:
        budget = budget_text() if config_ok else "unknown until config.yaml reads (above)"
    except LocalchatError as exc:  # (a setting of config.yaml that is not what it takes)
        config_ok, budget = False, f"NOT READ: {exc}"
    table.add_row("memory budget", budget)
    table.add_row(
        "HF offline", os.environ.get("HF_HUB_OFFLINE", "unset") + " (localchat sets 1 unless --allow-download)"
    )
    table.add_row("server", server_answers(base_url))
    table.add_row("prompt caches", prompt_cache_text())
    console.print(table)
    if config_ok:
        show_model_list(console)
        return 0
    console.print("models: not listed until config.yaml reads (above)", style="dim", markup=False)
    return 1
