"""The one clock and the one stats type, shared by every backend.

TTFT runs from the moment a turn is submitted (templating and tokenization included) to the
first visible text of any kind, reasoning or answer; TTFA (time to first answer) to the first
answer text, so a thinking model's TTFA - TTFT is how long it thought before answering. Decode
speed is (completion_tokens - 1) / (t_last - t_first) over both kinds, over the moments the clock
saw text arrive apart: chunks that came in one burst (one read of a socket) are one moment, the
first moment's tokens are not in the rate, and a reply that came in bursts (fewer moments than half
its tokens) has no decode speed, for the clock never saw it decode (a server's burst once printed
46,258 tok/s for the demo). The runtime's own figures (mlx_lm's prompt_tps/generation_tps)
travel beside ours, labelled as the runtime's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from localchat.backends import Finished

RESOLVED_S = 5e-4  # arrivals closer than this came together (a burst is parsed at 20-200 µs a chunk)
STATS_VERSION = 7  # 2: ttfa_s, reasoning_tokens, reasoning_estimated; 3: budget_tokens; 4: draft_tokens,
# cache_rebuilt; 5: mask_s, masked_tokens; 6: cache_break; 7: reasoning_cut


@dataclass(frozen=True)
class TurnStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float | None = None
    ttfa_s: float | None = None  # time to the first answer text (equal to TTFT when nothing was reasoned)
    prefill_tps: float | None = None  # tokens actually prefilled (prompt - cached) / TTFT
    decode_tps: float | None = None
    total_s: float = 0.0
    peak_memory_gb: float | None = None
    finish_reason: str | None = None  # the runtime's ("stop", "length"); None when it never said
    estimated: bool = False
    cache_miss_tokens: int = 0
    reasoning_tokens: int = 0
    reasoning_estimated: bool = False
    runtime: dict[str, float] = field(default_factory=dict)
    budget_tokens: int | None = None  # the prompt's budget (--max-context-tokens or the model's window)
    draft_tokens: int | None = None  # speculative decoding: completion tokens the draft model proposed
    cache_rebuilt: bool = False  # the KV cache could not be trimmed (rotating, hybrid): rebuilt from a checkpoint
    mask_s: float = 0.0  # time spent computing the grammar's masks (part of the decode time)
    masked_tokens: int = 0  # decoding steps under the grammar
    cache_break: str | None = None  # where the prompt broke from the server's cache ("message 0 (system)")
    reasoning_cut: bool = False  # the reasoning reached the thinking budget; its end was forced

    @property
    def thought(self) -> bool:
        return self.reasoning_tokens > 0

    @property
    def context_share(self) -> float | None:
        """The prompt's share of its budget: the context gauge."""
        return self.prompt_tokens / self.budget_tokens if self.budget_tokens and self.prompt_tokens else None


def stats_to_dict(stats: TurnStats) -> dict[str, Any]:
    """The stored form of a turn's figures (saved sessions, records), with its version."""
    return {"version": STATS_VERSION, **asdict(stats)}


def stats_from_dict(data: Any) -> TurnStats | None:
    """Figures stored by any localchat version: unknown fields are ignored, missing ones take
    their defaults, a value of the wrong type is dropped; None when ``data`` is not a mapping."""
    if not isinstance(data, dict):
        return None
    return TurnStats(**{name: value for name, value in data.items() if _fits(name, value)})


_OPTIONAL_NUMBER = (int, float, type(None))
_STORED_TYPES: dict[str, tuple[type, ...]] = {
    "prompt_tokens": (int,), "cached_tokens": (int,), "completion_tokens": (int,), "cache_miss_tokens": (int,),
    "ttft_s": _OPTIONAL_NUMBER, "ttfa_s": _OPTIONAL_NUMBER, "reasoning_tokens": (int,),
    "reasoning_estimated": (bool,), "prefill_tps": _OPTIONAL_NUMBER, "decode_tps": _OPTIONAL_NUMBER,
    "peak_memory_gb": _OPTIONAL_NUMBER, "total_s": (int, float), "finish_reason": (str, type(None)),
    "estimated": (bool,), "runtime": (dict,), "budget_tokens": (int, type(None)),
    "draft_tokens": (int, type(None)), "cache_rebuilt": (bool,), "mask_s": (int, float), "masked_tokens": (int,),
    "cache_break": (str, type(None)), "reasoning_cut": (bool,),
}


def _fits(name: str, value: Any) -> bool:
    types = _STORED_TYPES.get(name, ())
    if isinstance(value, bool) and bool not in types:
        return False
    if isinstance(value, dict):
        return dict in types and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values())
    return isinstance(value, types)


class TurnClock:
    """Timestamps of one turn; started when the user submits, before any templating.

    ``now`` is the clock (a fake one in tests); every figure of a turn comes from it.
    """

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self.now = now
        self.submitted = now()
        self.first: float | None = None
        self.first_answer: float | None = None
        self.last: float | None = None
        self.parts: list[str] = []
        self.reasoning_parts: list[str] = []
        self.arrivals: list[float] = []  # every chunk of text, either kind

    @property
    def text(self) -> str:
        """The answer."""
        return "".join(self.parts)

    @property
    def reasoning(self) -> str:
        return "".join(self.reasoning_parts)

    def on_text(self, text: str) -> None:
        """Answer text."""
        if text:
            now = self._tick()
            self.first_answer = now if self.first_answer is None else self.first_answer
            self.parts.append(text)

    def on_reasoning(self, text: str) -> None:
        if text:
            self._tick()
            self.reasoning_parts.append(text)

    def on_tool_call(self) -> None:
        """A piece of a call the model is writing: output on the clock, though not answer. A server
        that sends a call whole (mlx_lm.server) gives one arrival: TTFT, and no decode rate."""
        self._tick()

    def _tick(self) -> float:
        now = self.now()
        self.first = now if self.first is None else self.first
        self.last = now
        self.arrivals.append(now)
        return now

    def gaps(self) -> tuple[float, ...]:
        """Inter-chunk latencies (ITL): one gap between consecutive chunks, about one a token."""
        return tuple(b - a for a, b in zip(self.arrivals, self.arrivals[1:]))

    def decode_tps(self, tokens: int, grouped: bool = False) -> float | None:
        """The tokens that came after the first moment, over the time from the first arrival to the
        last. A moment is a run of arrivals closer than ``RESOLVED_S`` (a burst); the first one holds
        its share of the tokens (one, when every chunk came on its own: (n-1)/span). None when the
        clock saw the reply come in bursts: fewer moments than half its tokens (a reply read in one
        or two gulps was never seen decoding), unless the runtime decodes in groups (``grouped``:
        speculative decoding's accepted drafts come a few at once)."""
        gaps = self.gaps()
        moments = 1 + sum(gap >= RESOLVED_S for gap in gaps) if self.arrivals else 0
        if tokens < 2 or moments < 2 or (not grouped and moments < min(tokens, len(self.arrivals)) / 2):
            return None
        opening = next(i + 1 for i, gap in enumerate(gaps) if gap >= RESOLVED_S)  # arrivals of moment 1
        later = tokens - max(1, round(tokens * opening / len(self.arrivals)))
        if self.last is None or self.first is None:
            return None
        return later / (self.last - self.first) if later > 0 else None

    def finish(self, done: Finished | None) -> TurnStats:
        """Close the clock; ``done`` is None when the stream broke before the runtime reported."""
        end = self.now()
        ttft = self.first - self.submitted if self.first is not None else None
        ttfa = self.first_answer - self.submitted if self.first_answer is not None else None
        prefilled = (done.prompt_tokens - done.cached_tokens) if done else 0
        decode = self.decode_tps(done.completion_tokens, grouped=done.draft_tokens is not None) if done else None
        return TurnStats(
            prompt_tokens=done.prompt_tokens if done else 0,
            cached_tokens=done.cached_tokens if done else 0,
            completion_tokens=done.completion_tokens if done else 0,
            ttft_s=ttft,
            ttfa_s=ttfa,
            prefill_tps=prefilled / ttft if ttft and prefilled > 0 else None,
            decode_tps=decode,
            total_s=end - self.submitted,
            peak_memory_gb=done.peak_memory_gb if done else None,
            finish_reason=done.finish_reason if done else None,
            estimated=done.estimated if done else False,
            cache_miss_tokens=done.cache_miss_tokens if done else 0,
            reasoning_tokens=done.reasoning_tokens if done else 0,
            reasoning_estimated=done.reasoning_estimated if done else False,
            runtime=dict(done.runtime) if done else {},
            draft_tokens=done.draft_tokens if done else None,
            cache_rebuilt=done.cache_rebuilt if done else False,
            mask_s=done.mask_s if done else 0.0,
            masked_tokens=done.masked_tokens if done else 0,
            cache_break=done.cache_break if done else None,
            reasoning_cut=done.reasoning_cut if done else False,
        )


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile (``q`` in 0..1) that bench and load both report; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50, p90 and p99 of ``values``."""
    return {f"p{round(q * 100)}": percentile(values, q) for q in (0.5, 0.9, 0.99)}


@dataclass
class Ledger:
    """Every model call of a session (turns, committed or not, and compactions), for ``/stats``."""

    turns: list[TurnStats] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  # "turn" | "interrupted" | "tool-round" | "compaction", one each
    tool_calls: int = 0
    tool_s: float = 0.0  # inside the tools, never counted as model time

    def add(self, stats: TurnStats, kind: str = "turn") -> None:
        self.turns.append(stats)
        self.kinds.append(kind)

    def add_tools(self, calls: int, seconds: float) -> None:
        self.tool_calls += calls
        self.tool_s += seconds

    def summary(self) -> dict[str, float | int | None]:
        compactions = [t for t, kind in zip(self.turns, self.kinds) if kind == "compaction"]
        shares = [t.context_share for t in self.turns if t.context_share is not None]
        ttfts = [t.ttft_s for t in self.turns if t.ttft_s is not None]
        ttfas = [t.ttfa_s for t in self.turns if t.thought and t.ttfa_s is not None]
        speeds = [t.decode_tps for t in self.turns if t.decode_tps is not None]
        tokens_in = sum(t.prompt_tokens for t in self.turns)
        cached = sum(t.cached_tokens for t in self.turns)
        return {
            "turns": self.kinds.count("turn"),
            "interrupted": self.kinds.count("interrupted"),  # stopped by Ctrl+C: no figures worth a mean
            "tokens_in": tokens_in,
            "tokens_out": sum(t.completion_tokens for t in self.turns),
            "cached_share": cached / tokens_in if tokens_in else None,
            "ttft_mean_s": statistics.fmean(ttfts) if ttfts else None,
            "ttft_median_s": statistics.median(ttfts) if ttfts else None,
            "decode_tps_mean": statistics.fmean(speeds) if speeds else None,
            "decode_tps_median": statistics.median(speeds) if speeds else None,
            "reasoning_tokens": sum(t.reasoning_tokens for t in self.turns),
            "reasoning_estimated": any(t.reasoning_estimated for t in self.turns),
            "ttfa_median_s": statistics.median(ttfas) if ttfas else None,  # over turns that thought
            "context_share_last": shares[-1] if shares else None,
            "context_share_max": max(shares) if shares else None,
            "compactions": len(compactions),
            "compaction_tokens": sum(t.prompt_tokens + t.completion_tokens for t in compactions),
            "compaction_s": sum(t.total_s for t in compactions),
            "tool_rounds": self.kinds.count("tool-round"),
            "tool_calls": self.tool_calls,
            "tool_s": self.tool_s,
            **_masked(self.turns),
            **_drafted(self.turns),
        }


def _masked(turns: list[TurnStats]) -> dict[str, float | int | None]:
    """The grammar's cost: its mask time per masked decoding step, over the calls that masked."""
    steps = sum(t.masked_tokens for t in turns)
    return {"masked_tokens": steps, "mask_us_per_token": sum(t.mask_s for t in turns) / steps * 1e6 if steps else None}


def _drafted(turns: list[TurnStats]) -> dict[str, float | int | None]:
    """Speculative decoding's acceptance: the share of generated tokens the draft model proposed
    and the model kept (over the calls that drafted)."""
    drafting = [t for t in turns if t.draft_tokens is not None]
    generated = sum(t.completion_tokens for t in drafting)
    kept = sum(t.draft_tokens or 0 for t in drafting)
    return {"draft_tokens": kept, "draft_share": kept / generated if generated else None}


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
               f"think {'~' if stats.reasoning_estimated else ''}{stats.reasoning_tokens}"
               f"{' (cut at the budget)' if stats.reasoning_cut else ''}"] if stats.thought else []
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
        f"cache broke at {stats.cache_break}" if stats.cache_break else None,
        "estimated counts" if stats.estimated else None,
        *(extra or []),
    ]
    return "[" + " · ".join(p for p in parts if p) + "]"
