"""The policy bench's figures: per history policy, what it costs (prompt and prefilled tokens,
TTFT, compaction calls) and what it buys (recall of early facts and of recent ones)."""

from __future__ import annotations

import statistics
from typing import Any


def _rate(records: list[Any]) -> dict[str, Any]:
    correct = sum(bool(r.correct) for r in records)
    return {"correct": correct, "scored": len(records), "accuracy": correct / len(records) if records else None}


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def policy_summary(turns: list[Any]) -> dict[str, dict[str, Any]]:
    """Per policy arm (arms without a policy are left out): accuracy on early and recent facts,
    mean prompt and prefilled tokens a turn, TTFT, and the compactions with their cost
    (``all_tokens_per_turn`` adds the summary calls' tokens to the turns' prompts)."""
    arms = list(dict.fromkeys(r.arm for r in turns if r.policy is not None))
    summary = {}
    for arm in arms:
        records = [r for r in turns if r.arm == arm]
        ttft = [r.ttft_s for r in records if r.ttft_s is not None]
        summary[arm] = {
            "policy": records[0].policy, "turns": len(records),
            "early": _rate([r for r in records if r.fact == "early"]),
            "early_by_script": {script: _rate([r for r in records if r.fact == "early" and r.script == script])
                                for script in dict.fromkeys(r.script for r in records if r.fact == "early")},
            "recent": _rate([r for r in records if r.fact == "recent"]),
            "prompt_tokens_mean": _mean([r.prompt_tokens for r in records]),
            "all_tokens_per_turn": _mean([r.prompt_tokens + r.compaction_tokens for r in records]),
            "prefilled_tokens_mean": _mean([r.prompt_tokens - r.cached_tokens for r in records]),
            "ttft_median_s": statistics.median(ttft) if ttft else None,
            "compactions": sum(r.compactions for r in records),
            "compaction_tokens": sum(r.compaction_tokens for r in records),
            "compaction_s": sum(r.compaction_s for r in records),
            "dropped_turns": sum(r.dropped_turns for r in records),
        }
    return summary
