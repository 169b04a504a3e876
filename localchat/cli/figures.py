"""The figures a person reads: a turn's one line (``[TTFT 0.42s · 41.2 tok/s · in 274 …]``) and
what a save did."""

from __future__ import annotations

from localchat.conversation.stats import TurnStats
from localchat.store.keeper import Saved
from localchat.store.session_cache import CacheWrite
from localchat.wording import count


def saved_line(saved: Saved, turns: int) -> str:
    """What ``/save`` (or leaving a resumed session) did, and how to continue."""
    cache = f" {saved.cache.describe()}" if saved.cache else ""
    return (f"{'updated' if saved.replaced else 'saved'} '{saved.name}' ({count(turns, 'turn')}){cache}; "
            f"continue later with: localchat chat --resume {saved.name}")


def kept_line(name: str | None, uid: str, turns: int, cache: CacheWrite | None) -> str:
    """What leaving a kept conversation did (its last state and KV cache), and how to continue."""
    again = f"--resume {name}" if name else "--continue"
    written = f" {cache.describe()}" if cache else ""
    return (f"kept {repr(name) if name else uid} ({count(turns, 'turn')}){written}; continue later with: "
            f"localchat chat {again}")


def _memory(gb: float | None) -> str | None:
    if gb is None:
        return None
    return f"peak {gb:.1f} GB" if gb >= 1 else f"peak {gb * 1024:.0f} MB"


def stats_line(stats: TurnStats, extra: list[str] | None = None) -> str:
    """One line of figures: ``[TTFT 0.42s · 41.2 tok/s · in 274 (cached 256) · out 52 · …]``; a
    turn that thought adds its time to the first answer token and its reasoning tokens after TTFT;
    ``extra`` (a turn's tool rounds and tool time) goes last."""
    est = "~" if stats.estimated else ""
    cached = f" (cached {stats.cached_tokens})" if stats.cached_tokens else ""
    thought = [f"answer {stats.ttfa_s:.2f}s" if stats.ttfa_s is not None else "no answer",
               f"think {'~' if stats.reasoning_estimated else ''}{stats.reasoning_tokens}"] if stats.thought else []
    parts = [
        f"TTFT {stats.ttft_s:.2f}s" if stats.ttft_s is not None else "TTFT –",
        *thought,
        f"{stats.decode_tps:.1f} tok/s" if stats.decode_tps is not None else None,
        f"in {est}{stats.prompt_tokens}{cached}" if stats.prompt_tokens else None,
        f"out {est}{stats.completion_tokens}" if stats.completion_tokens else None,
        f"{stats.total_s:.2f}s",
        f"ctx {round(100 * stats.context_share)} %" if stats.context_share is not None else None,
        f"drafted {stats.draft_tokens}/{stats.completion_tokens}" if stats.draft_tokens is not None else None,
        "KV cache rebuilt" if stats.cache_rebuilt else None,
        _memory(stats.peak_memory_gb),
        f"dropped {stats.cache_miss_tokens} cached" if stats.cache_miss_tokens else None,
        "estimated counts" if stats.estimated else None,
        *(extra or []),
    ]
    return "[" + " · ".join(p for p in parts if p) + "]"
