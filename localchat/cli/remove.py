"""``localchat rm``: free the disk of a model ``pull`` fetched or ``import`` made, after asking.

A pulled model leaves the Hugging Face cache by the client's own delete strategy (its lock folder
too); an imported one leaves the user's registry first, then its directory goes, so the registry
never names a model that is not there. serve's prompt caches of the same weights go with either.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from localchat.errors import LocalchatError, UsageError
from localchat.registry import ModelRef, directory_size, resolve
from localchat.sizes import shown_size


def confirm(console: Console, what: str, size: int, yes: bool) -> bool:
    """Whether to go on: ``--yes``, or a ``y`` on the terminal (no terminal is a usage error)."""
    if yes:
        return True
    if not sys.stdin.isatty():
        raise UsageError(f"rm would free {shown_size(size)} ({what}): add --yes (there is no terminal to ask on)")
    answer = console.input(f"remove {what} ({shown_size(size)})? [y/N] ", markup=False)
    if answer.strip().lower() in ("y", "yes"):
        return True
    console.print("kept", style="dim")
    return False


def prompt_caches_of(model_dir: Path | None) -> Callable[[], int]:
    """What removes serve's prompt caches of these weights (found by their fingerprint, taken now,
    before the weights go); it returns the bytes freed."""
    from localchat.backends.saved_cache import model_fingerprint
    from localchat.store.prompt_files import PromptFiles, default_root

    weights = model_fingerprint(model_dir) if model_dir is not None else None
    PromptFiles(default_root()).check_root()  # (refused before the weights go, not after)
    return lambda: PromptFiles(default_root()).remove_model(weights) if weights else 0


def _removed(console: Console, what: str, size: int, caches: Callable[[], int], after: str = "") -> None:
    freed = caches()
    also = f" (and {shown_size(freed)} of serve's prompt caches)" if freed else ""
    console.print(f"removed {what}: {shown_size(size)} freed{also}{after}", markup=False)


def remove_pulled(ref: ModelRef, yes: bool, console: Console) -> None:
    from huggingface_hub import constants, scan_cache_dir

    from localchat.registry import hub_snapshot

    try:
        cache = scan_cache_dir()
    except Exception:  # no cache directory yet (the client's CacheNotFound), or one it cannot read
        cache = None
    repos = [r for r in cache.repos if r.repo_id == ref.location and r.repo_type == "model"] if cache else []
    if cache is None or not repos:
        raise LocalchatError(f"{ref.location} is not in the Hugging Face cache: nothing to remove")
    strategy = cache.delete_revisions(*[rev.commit_hash for r in repos for rev in r.revisions])
    if not confirm(console, ref.location, strategy.expected_freed_size, yes):
        return
    caches = prompt_caches_of(hub_snapshot(ref.location))
    strategy.execute()
    locks = Path(constants.HF_HUB_CACHE) / ".locks" / f"models--{ref.location.replace('/', '--')}"
    shutil.rmtree(locks, ignore_errors=True)  # the client keeps a lock folder per repo; it goes too
    _removed(console, ref.location, strategy.expected_freed_size, caches)


def remove_imported(ref: ModelRef, yes: bool, console: Console) -> None:
    """A model ``import`` made (its entry in the user's registry and its directory), or the import
    of a packaged GGUF (made again from the package on its next use)."""
    from localchat.store.user_models import remove_user_model

    directory = Path(ref.location)
    if not directory.is_dir():
        raise LocalchatError(f"{ref.id} has no imported directory at {directory}: nothing to remove")
    size = directory_size(directory)
    if not confirm(console, f"{ref.id} at {directory}", size, yes):
        return
    caches = prompt_caches_of(directory)
    if ref.kind != "package-gguf":
        remove_user_model(ref.id)
    shutil.rmtree(directory)
    again = " (imported again from its package on its next use)" if ref.kind == "package-gguf" else ""
    _removed(console, ref.id, size, caches, again)


def run_rm(*, model: str, yes: bool, console: Console) -> None:
    from localchat.serve.in_use import serving

    ref = resolve(model)
    if users := serving(ref.location):
        where = ", ".join(f"port {s.port} (pid {s.pid})" for s in users)
        raise LocalchatError(f"{ref.id} is being served by localchat serve on {where}: stop it first, then remove it")
    if ref.kind == "hub":
        remove_pulled(ref, yes, console)
    elif ref.kind == "package-gguf" or (ref.entry is not None and ref.entry.imported is not None):
        remove_imported(ref, yes, console)
    else:
        raise UsageError(f"{model} is neither pulled nor imported ({ref.kind}: {ref.location}); nothing removed")
