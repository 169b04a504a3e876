"""How sure bench's figures are: each arm's figures with 95 % intervals, and two arms compared
turn by turn (they played the same drawn conversations), through ``localchat.intervals``.

A conversation (a script's conversation in one repeat) is the unit every interval resamples. With
one repeat no interval is given: the summary says how many repeats would give one.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from localchat.intervals import Interval, bootstrap, cluster_mean, mcnemar_p, paired_difference, paired_ratio

ADVISED_REPEATS = 5
Key = tuple[str, int, int]  # (script, repeat, conversation)


def repeats(records: Sequence[Any]) -> int:
    return len({r.repeat for r in records})


def no_interval(records: Sequence[Any]) -> str | None:
    """Why no interval can be given (one repeat), or None when one can."""
    if repeats(records) < 2:
        return f"one repeat: no interval can be given (--repeat {ADVISED_REPEATS} gives 95 % intervals)"
    return None


def clusters(records: Sequence[Any], value: Callable[[Any], float | None]) -> dict[Key, list[float]]:
    found: dict[Key, list[float]] = {}
    for r in records:
        v = value(r)
        if v is not None:
            found.setdefault((r.script, r.repeat, r.conversation), []).append(v)
    return found


def arm_intervals(records: Sequence[Any]) -> dict[str, dict]:
    """Accuracy (clustered), and the medians of TTFT, decode tok/s and total time (bootstrap)."""
    why = no_interval(records)

    def shown(interval: Interval) -> dict:
        return Interval(interval.value, why=why).as_dict() if why else interval.as_dict()

    accuracy = cluster_mean(list(clusters(records, lambda r: float(r.correct) if r.scored else None).values()),
                            share=True)
    medians = {name: bootstrap(list(clusters(records, pick).values()))
               for name, pick in (("ttft_median_s", lambda r: r.ttft_s), ("decode_tps_median", lambda r: r.decode_tps),
                                  ("total_s_median", lambda r: r.total_s))}
    return {"accuracy": shown(accuracy), **{name: shown(i) for name, i in medians.items()}}


def paired(a: Sequence[Any], b: Sequence[Any]) -> dict[str, Any]:
    """Arm ``a`` against arm ``b`` turn by turn: the accuracy difference (paired, clustered) with
    the exact McNemar test, and the TTFT and prompt-token ratios (paired bootstrap)."""
    by_turn = {(r.script, r.repeat, r.conversation, r.turn): r for r in b}
    matched = [(r, by_turn[k]) for r in a if (k := (r.script, r.repeat, r.conversation, r.turn)) in by_turn]
    scored = [(x, y) for x, y in matched if x.scored and y.scored]
    pairs: dict[Key, list[tuple[float, float]]] = {}
    for x, y in scored:
        pairs.setdefault((x.script, x.repeat, x.conversation), []).append((float(x.correct), float(y.correct)))
    why = no_interval(a)
    difference = paired_difference(list(pairs.values()))
    ttft = _paired_ratio(matched, lambda r: r.ttft_s, statistics.median)
    prompt = _paired_ratio(matched, lambda r: r.prompt_tokens, statistics.fmean)
    result = {"accuracy_difference": difference, "ttft_ratio": ttft, "prompt_token_ratio": prompt}
    out: dict[str, Any] = {name: (Interval(i.value, why=why) if why else i).as_dict() for name, i in result.items()}
    out["mcnemar_p"] = mcnemar_p([(bool(x.correct), bool(y.correct)) for x, y in scored])
    out["discordant_turns"] = sum(bool(x.correct) != bool(y.correct) for x, y in scored)
    return out


def _paired_ratio(matched: list[tuple[Any, Any]], value: Callable[[Any], float | None],
                  statistic: Callable[[list[float]], float]) -> Interval:
    tops: dict[Key, list[float]] = {}
    bottoms: dict[Key, list[float]] = {}
    for x, y in matched:
        top, bottom = value(x), value(y)
        if top is not None and bottom is not None:
            key = (x.script, x.repeat, x.conversation)
            tops.setdefault(key, []).append(top)
            bottoms.setdefault(key, []).append(bottom)
    keys = list(tops)
    return paired_ratio([tops[k] for k in keys], [bottoms[k] for k in keys], statistic=statistic)
