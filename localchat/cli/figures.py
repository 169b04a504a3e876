"""The figures a person reads: a turn's one line (``[TTFT 0.42s · 41.2 tok/s · in 274 …]``) and
what a save did."""

from __future__ import annotations

from localchat.store.keeper import Saved
from localchat.store.session_cache import CacheWrite
from localchat.wording import count, run_as


def saved_line(saved: Saved, turns: int) -> str:
    """What ``/save`` (or leaving a resumed session) did, and how to continue."""
    cache = f" {saved.cache.describe()}" if saved.cache else ""
    return (f"{'updated' if saved.replaced else 'saved'} '{saved.name}' ({count(turns, 'turn')}){cache}; "
            f"continue later with: {run_as()} chat --resume {saved.name}")


def kept_line(name: str | None, uid: str, turns: int, cache: CacheWrite | None) -> str:
    """What leaving a kept conversation did (its last state and KV cache), and how to continue."""
    again = f"--resume {name}" if name else "--continue"
    written = f" {cache.describe()}" if cache else ""
    return (f"kept {repr(name) if name else uid} ({count(turns, 'turn')}){written}; continue later with: "
            f"{run_as()} chat {again}")
