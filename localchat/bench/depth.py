"""``bench --depth 0,256,512,…``: what a turn costs with d tokens of conversation already in the
context, prefilled whole (uncached) and with the conversation already in the KV cache (cached).

For each backend, depth and repeat, a conversation of accepted filler turns (notes and ``OK``s) is
built up to d prompt tokens, under a system message no other point shares (so no earlier cache
serves it), and two questions follow through the same ``ChatSession`` as ``chat``: the first
prefills everything (uncached), the second only what is new (cached: the previous prompt is in
the cache, in-process or in mlx_lm.server's prompt cache). Each point's TTFT, prefill and decode
speed, with intervals over the repeats; the fitted growth of TTFT with depth, for both.
"""

from __future__ import annotations

import hashlib
import statistics
from dataclasses import dataclass, replace
from typing import Any

from localchat.backends import GenerationParams
from localchat.conversation.history import Conversation, Turn
from localchat.conversation.turn import ChatSession
from localchat.errors import UsageError
from localchat.intervals import bootstrap

MAX_DEPTHS = 16
MAX_DEPTH_TOKENS = 262_144  # a model's window is smaller still; one whose window is not known here stops here
QUESTIONS = ("What is the first note about? Answer briefly.", "And the last note? Answer briefly.")
WORDS = ("harbor", "river", "falcon", "maple", "copper", "violet", "lantern", "meadow", "anchor", "cedar")


@dataclass(frozen=True)
class DepthPoint:
    backend: str
    depth: int  # as asked
    context_tokens: int  # the conversation's prompt tokens before the question, as built
    repeat: int
    kind: str  # "uncached" | "cached"
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float | None
    prefill_tps: float | None
    decode_tps: float | None
    status: str = "committed"  # what became of the turn (an empty reply has no TTFT)


def parse_depths(text: str, window: int | None) -> tuple[int, ...]:
    """``0,256,512`` → the depths, checked against the model's window (a usage line otherwise)."""
    try:
        depths = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise UsageError(f"--depth takes token counts separated by commas (0,256,512), not {text!r}") from None
    if not depths or len(depths) > MAX_DEPTHS or depths[0] < 0 or depths[-1] > MAX_DEPTH_TOKENS:
        raise UsageError(f"--depth takes 1 to {MAX_DEPTHS} token counts from 0 to {MAX_DEPTH_TOKENS:,}")
    if window is not None and depths[-1] + 256 > window:
        raise UsageError(f"--depth {depths[-1]} does not leave room for a turn in the model's window of {window} "
                         "tokens: keep every depth below the window less 256")
    return depths


def filler(backend: Any, system: str, depth: int) -> list[Turn]:
    """Accepted turns (a note, then ``OK``) until the prompt holds ``depth`` tokens (or just over):
    as many as the first turns' size says at once, then one at a time (a prompt is tokenized a few
    times, not once a turn)."""
    if not depth:
        return []
    turns = [_note(0), _note(1)]
    per_turn = max(1, (_tokens(backend, system, turns) - _tokens(backend, system, turns[:1])))
    missing = depth - _tokens(backend, system, turns)
    turns += [_note(i) for i in range(2, 2 + max(0, missing // per_turn - 1))]
    while _tokens(backend, system, turns) < depth:
        turns.append(_note(len(turns)))
    return turns


def _note(i: int) -> Turn:
    return Turn(user=f"Note {i + 1}: the {WORDS[i % 10]} by the {WORDS[(i * 3 + 1) % 10]} is "
                     f"{WORDS[(i * 7 + 2) % 10]} number {i * 13 % 97}. Reply only OK.", assistant="OK")


def _tokens(backend: Any, system: str, turns: list[Turn]) -> int:
    history = Conversation.for_backend(backend, system, turns).history()
    return len(backend.template.ids(history, None)) if turns else 0


def measure(backend: Any, name: str, depths: tuple[int, ...], repeats: int, params: GenerationParams,
            on_point: Any = lambda *_: None, seed: int = 0) -> list[DepthPoint]:
    """Every depth, ``repeats`` times, in an order that alternates direction between repeats (so a
    slow spell of the machine does not fall on one end of the sweep)."""
    points: list[DepthPoint] = []
    for repeat in range(repeats):
        for depth in depths if repeat % 2 == 0 else tuple(reversed(depths)):
            on_point(name, depth, repeat)
            salt = hashlib.sha256(f"{seed}/{name}/{depth}/{repeat}".encode()).hexdigest()[:12]
            system = f"{salt} You are a helpful assistant."  # a prefix no other point shares; the same every run
            turns = filler(backend, system, depth)
            context = _tokens(backend, system, turns)
            session = ChatSession(backend, Conversation.for_backend(backend, system, turns),
                                  replace(params, max_tokens=min(params.max_tokens, 32))).prepare()
            for kind, question in zip(("uncached", "cached"), QUESTIONS):
                result = session.ask(question)
                s = result.stats
                points.append(DepthPoint(backend=name, depth=depth, context_tokens=context, repeat=repeat, kind=kind,
                                         prompt_tokens=s.prompt_tokens, cached_tokens=s.cached_tokens,
                                         ttft_s=s.ttft_s, prefill_tps=s.prefill_tps, decode_tps=s.decode_tps,
                                         status=result.status.value))
    return points


def summarize(points: list[DepthPoint]) -> dict:
    """Per backend and kind: each depth's medians with intervals, and TTFT's fitted growth (ms per
    1,000 tokens of context, by least squares on every point)."""
    out: dict = {}
    for backend in dict.fromkeys(p.backend for p in points):
        for kind in ("uncached", "cached"):
            mine = [p for p in points if p.backend == backend and p.kind == kind]
            rows = []
            for depth in sorted({p.depth for p in mine}):
                at = [p for p in mine if p.depth == depth]
                rows.append({"depth": depth, "context_tokens": round(statistics.fmean(p.context_tokens for p in at)),
                             "ttft_s": _median(at, "ttft_s"), "prefill_tps": _median(at, "prefill_tps"),
                             "decode_tps": _median(at, "decode_tps")})
            out[f"{backend} {kind}"] = {"points": rows, "growth_ms_per_1k": _slope(mine)}
    return out


def _median(points: list[DepthPoint], name: str) -> dict:
    """The median over the repeats (each one value) with its bootstrap interval."""
    return bootstrap([[getattr(p, name)] for p in points if getattr(p, name) is not None]).as_dict()


def _slope(points: list[DepthPoint]) -> float | None:
    pairs = [(p.context_tokens, p.ttft_s) for p in points if p.ttft_s is not None]
    if len({x for x, _ in pairs}) < 2:
        return None
    mean_x = statistics.fmean(x for x, _ in pairs)
    mean_y = statistics.fmean(y for _, y in pairs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in pairs) / sum((x - mean_x) ** 2 for x, _ in pairs)
    return slope * 1000 * 1000  # seconds per token → ms per 1,000 tokens


