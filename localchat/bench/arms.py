"""``localchat bench`` core: run scripted conversations through arms and return data, never print.

An arm is (backend, history on/off, KV reuse on/off, thinking on/off or the model's default). Every arm plays
the same conversations with the same variable draws, through the same ChatSession as ``localchat chat``, so
the figures are the ones a user sees. With history on, total input over N turns grows as N·S + T·N(N+1)/2; the
summary fits S and T to the measured prompt tokens.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from localchat.backends import Backend, GenerationParams
from localchat.bench.policies import policy_summary
from localchat.bench.script import BenchScript, plan
from localchat.bench.uncertainty import arm_intervals, no_interval, paired
from localchat.conversation.history import Conversation
from localchat.conversation.policy import HistoryPolicy
from localchat.conversation.settings import TrimPolicy
from localchat.conversation.stats import percentile
from localchat.conversation.turn import ChatSession
from localchat.grammar.think_budget import ThinkBudget


@dataclass(frozen=True)
class Arm:
    backend: str  # "inproc" | "server"
    history: bool
    cache_reuse: bool = True
    think: bool | None = None  # None: the model's default (nothing is sent)
    policy: HistoryPolicy | None = None  # the policy bench: how the history stays in its budget
    think_budget: int | None = None  # reasoning tokens at most (--think-budget); None: no budget

    @property
    def label(self) -> str:
        reuse = "" if self.cache_reuse else " no-reuse"
        think = "" if self.think is None else f" think-{'on' if self.think else 'off'}"
        think += "" if self.think_budget is None else f" budget-{self.think_budget}"
        if self.policy is not None:
            return f"{self.backend} {self.policy.label}{reuse}{think}"
        return f"{self.backend} history-{'on' if self.history else 'off'}{reuse}{think}"

    @property
    def family(self) -> str:
        """The label without the thinking setting: arms that differ only in it are compared."""
        return replace(self, think=None).label


@dataclass(frozen=True)
class TurnRecord:
    arm: str
    backend: str
    history: bool
    cache_reuse: bool
    think: bool | None
    script: str
    repeat: int
    conversation: int
    turn: int
    user: str
    answer: str
    reasoning: str
    expected: str | None
    scored: bool
    correct: bool | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float | None
    ttfa_s: float | None  # time to the first answer token
    reasoning_tokens: int
    reasoning_estimated: bool
    prefill_tps: float | None
    decode_tps: float | None
    total_s: float
    peak_memory_gb: float | None
    finish_reason: str | None  # the runtime's
    status: str  # what became of the turn (localchat.conversation.turn.TurnStatus)
    error: str | None
    estimated: bool
    cache_miss: bool  # history on, KV reuse on: fewer cached tokens than the previous prompt
    policy: str | None = None
    fact: str | None = None  # early | recent: what a scored turn asked about
    dropped_turns: int = 0  # left out of this request to fit the budget
    compactions: int = 0  # summary calls made before this turn
    compaction_tokens: int = 0  # their prompt and completion tokens
    compaction_s: float = 0.0  # their time
    tool_rounds: int = 0  # model rounds that ended in tool calls before the answer
    tool_calls: int = 0
    tool_s: float = 0.0  # time inside the tools, apart from model time
    tool_prompt_tokens: int = 0  # what the calls and their results add to the answer's prompt
    think_budget: int | None = None  # the arm's thinking budget
    reasoning_cut: bool = False  # the reasoning reached it and its end was forced


@dataclass(frozen=True)
class BenchPlan:
    scripts: list[BenchScript]
    repeat: int
    warmup: int
    params: GenerationParams
    seed: int
    tools: Any = None  # tools.runner.ToolRunner: the functions every conversation offers


OnTurn = Callable[[str, int, str, int], None]  # (arm label, repeat, script, turn)


def play_conversation(backend: Backend, arm: Arm, script: BenchScript, conversation: int, repeat: int,
                      bench: BenchPlan, on_turn: OnTurn) -> list[TurnRecord]:
    history = Conversation.for_backend(backend, script.system)
    budget = ThinkBudget(tokens=arm.think_budget) if arm.think_budget is not None else None
    session = ChatSession(backend, history, replace(bench.params, think=arm.think, think_budget=budget),
                          use_history=arm.history,
                          trim=arm.policy.trim(TrimPolicy()) if arm.policy else TrimPolicy(),
                          compaction=arm.policy.compaction() if arm.policy else None, tools=bench.tools).prepare()
    records: list[TurnRecord] = []
    for i, turn in enumerate(plan(script, bench.seed, repeat, conversation), 1):
        on_turn(arm.label, repeat, script.name, i)
        if turn.pin and arm.policy is not None and arm.policy.pins_facts:
            history.pins.append(turn.pin)
        result = session.ask(turn.user)
        s = result.stats
        summary = result.compaction.result.stats if result.compaction and result.compaction.result else None
        previous = records[-1].prompt_tokens if records else None
        miss = arm.history and arm.cache_reuse and previous is not None and s.cached_tokens < previous
        records.append(TurnRecord(
            arm=arm.label, backend=arm.backend, history=arm.history, cache_reuse=arm.cache_reuse, think=arm.think,
            script=script.name, repeat=repeat, conversation=conversation, turn=i, user=turn.user,
            answer=result.text, reasoning=result.reasoning, expected=turn.expect or turn.expect_regex,
            scored=turn.scored, correct=turn.is_correct(result.text) if turn.scored else None,
            prompt_tokens=s.prompt_tokens, cached_tokens=s.cached_tokens, completion_tokens=s.completion_tokens,
            ttft_s=s.ttft_s, ttfa_s=s.ttfa_s, reasoning_tokens=s.reasoning_tokens,
            reasoning_estimated=s.reasoning_estimated,
            prefill_tps=s.prefill_tps, decode_tps=s.decode_tps, total_s=s.total_s,
            peak_memory_gb=s.peak_memory_gb, finish_reason=s.finish_reason, status=result.status.value,
            error=result.error,
            estimated=s.estimated, cache_miss=miss, policy=arm.policy.label if arm.policy else None, fact=turn.fact,
            dropped_turns=result.dropped_turns, compactions=int(summary is not None),
            compaction_tokens=summary.prompt_tokens + summary.completion_tokens if summary else 0,
            compaction_s=summary.total_s if summary else 0.0, tool_rounds=len(result.steps),
            tool_calls=sum(len(step.calls) for step in result.steps), tool_s=result.tool_s,
            tool_prompt_tokens=result.tool_prompt_tokens, think_budget=arm.think_budget,
            reasoning_cut=s.reasoning_cut))
    return records


def run_arm(backend: Backend, arm: Arm, bench: BenchPlan, on_turn: OnTurn = lambda *_: None) -> list[TurnRecord]:
    """Warm-up repeats (discarded, with their own draws), then the measured repeats."""
    records: list[TurnRecord] = []
    for repeat in range(-bench.warmup, bench.repeat):
        for script in bench.scripts:
            for c in range(len(script.conversations)):
                played = play_conversation(backend, arm, script, c, repeat, bench, on_turn)
                if repeat >= 0:
                    records += played
    return records


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize_arm(records: list[TurnRecord]) -> dict:
    scored = [r for r in records if r.scored]
    correct = sum(bool(r.correct) for r in scored)
    ttft = [r.ttft_s for r in records if r.ttft_s is not None]
    ttfa = [r.ttfa_s for r in records if r.ttfa_s is not None]
    decode = [r.decode_tps for r in records if r.decode_tps is not None]
    return {
        "turns": len(records), "scored": len(scored), "correct": correct,
        "accuracy": correct / len(scored) if scored else None,
        "ttft_median_s": _median(ttft), "ttft_p90_s": percentile(ttft, 0.9),
        "ttfa_median_s": _median(ttfa), "ttfa_p90_s": percentile(ttfa, 0.9),
        "total_s_median": _median([r.total_s for r in records]),
        "completion_tokens_total": sum(r.completion_tokens for r in records),
        "reasoning_tokens_total": sum(r.reasoning_tokens for r in records),
        "reasoning_tokens_mean": statistics.fmean(r.reasoning_tokens for r in records) if records else None,
        "reasoning_estimated": any(r.reasoning_estimated for r in records),
        "decode_tps_median": _median(decode), "decode_tps_p90": percentile(decode, 0.9),
        "prompt_tokens_total": sum(r.prompt_tokens for r in records),
        "cached_tokens_total": sum(r.cached_tokens for r in records),
        "prefilled_tokens_total": sum(r.prompt_tokens - r.cached_tokens for r in records),
        "cache_misses": sum(r.cache_miss for r in records),
        "tool_rounds_total": sum(r.tool_rounds for r in records),
        "tool_calls_total": sum(r.tool_calls for r in records),
        "tool_s_total": sum(r.tool_s for r in records),
        "tool_prompt_tokens_mean": statistics.fmean(r.tool_prompt_tokens for r in records) if records else None,
        "estimated_counts": any(r.estimated for r in records),
        "per_script_accuracy": {
            name: _accuracy([r for r in scored if r.script == name])
            for name in dict.fromkeys(r.script for r in records)},
    }


def _accuracy(scored: list[TurnRecord]) -> dict:
    correct = sum(bool(r.correct) for r in scored)
    return {"correct": correct, "scored": len(scored), "accuracy": correct / len(scored) if scored else None}


def fit_growth(records: list[TurnRecord]) -> dict | None:
    """Least-squares fit of prompt tokens at turn n ≈ S + T·n; the total over N turns is then
    N·S + T·N(N+1)/2. Returns S, T, R² and the measured vs modelled total input."""
    points = [(r.turn, r.prompt_tokens) for r in records]
    if len({n for n, _ in points}) < 2:
        return None
    mean_n = statistics.fmean(n for n, _ in points)
    mean_p = statistics.fmean(p for _, p in points)
    sxx = sum((n - mean_n) ** 2 for n, _ in points)
    t = sum((n - mean_n) * (p - mean_p) for n, p in points) / sxx
    s = mean_p - t * mean_n
    ss_tot = sum((p - mean_p) ** 2 for _, p in points)
    ss_res = sum((p - (s + t * n)) ** 2 for n, p in points)
    conversations: dict[tuple, list[int]] = {}
    for r in records:
        conversations.setdefault((r.script, r.repeat, r.conversation), []).append(r.prompt_tokens)
    longest = max(conversations.values(), key=len)
    n = len(longest)
    # Over all points the fitted values sum to the measured ones (least squares with an intercept),
    # so the model is checked on one conversation: the longest.
    return {"S": s, "T": t, "r2": 1 - ss_res / ss_tot if ss_tot else 1.0,
            "mean_abs_error_tokens": statistics.fmean(abs(p - (s + t * k)) for k, p in points),
            "longest_turns": n, "measured_total": sum(longest), "model_total": n * s + t * n * (n + 1) / 2}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _accuracy_difference(on: dict, off: dict) -> float | None:
    return on["accuracy"] - off["accuracy"] if on["accuracy"] is not None and off["accuracy"] is not None else None


def compare(on: dict, off: dict) -> dict:
    """History on vs off, for one backend: what history buys and what it costs."""
    return {
        "accuracy_difference": _accuracy_difference(on, off),
        "prompt_token_ratio": _ratio(on["prompt_tokens_total"], off["prompt_tokens_total"]),
        "ttft_ratio": _ratio(on["ttft_median_s"], off["ttft_median_s"]),
    }


def thinking_cost(on: dict, off: dict) -> dict:
    """Thinking on vs off, for one backend and history setting: what the reasoning costs and buys."""
    return {
        "accuracy_difference": _accuracy_difference(on, off),
        "ttft_ratio": _ratio(on["ttft_median_s"], off["ttft_median_s"]),
        "ttfa_ratio": _ratio(on["ttfa_median_s"], off["ttfa_median_s"]),
        "completion_token_ratio": _ratio(on["completion_tokens_total"], off["completion_tokens_total"]),
        "total_time_ratio": _ratio(on["total_s_median"], off["total_s_median"]),
        "reasoning_tokens_per_turn": on["reasoning_tokens_mean"],
    }


def reuse_savings(reuse: dict, no_reuse: dict) -> dict:
    return {
        "prefilled_tokens_saved": no_reuse["prefilled_tokens_total"] - reuse["prefilled_tokens_total"],
        "prefilled_ratio": reuse["prefilled_tokens_total"] / no_reuse["prefilled_tokens_total"]
        if no_reuse["prefilled_tokens_total"] else None,
        "ttft_ratio": reuse["ttft_median_s"] / no_reuse["ttft_median_s"]
        if reuse["ttft_median_s"] and no_reuse["ttft_median_s"] else None,
    }


@dataclass
class BenchResult:
    environment: dict
    settings: dict
    turns: list[TurnRecord] = field(default_factory=list)
    depth: list = field(default_factory=list)  # bench.depth.DepthPoint: the --depth sweep

    @property
    def arms(self) -> list[str]:
        return list(dict.fromkeys(r.arm for r in self.turns))

    def records(self, arm: str) -> list[TurnRecord]:
        return [r for r in self.turns if r.arm == arm]

    def summary(self) -> dict:
        """Per arm, then each pair of arms that differ in one setting: history on vs off (keyed by
        backend, and thinking when set), KV reuse on vs off, thinking on vs off."""
        arms = {arm: summarize_arm(self.records(arm)) for arm in self.arms}
        growth = {arm: fit_growth(self.records(arm)) for arm in self.arms}
        comparisons, savings, thinking, budgets = {}, {}, {}, {}
        for label, arm in self._arm_settings().items():
            key = label.replace(" history-on", "")
            if arm.history and arm.cache_reuse and (off := replace(arm, history=False).label) in arms:
                comparisons[key] = compare(arms[label], arms[off]) | {"paired": self._paired(label, off)}
            if arm.history and arm.cache_reuse and (plain := replace(arm, cache_reuse=False).label) in arms:
                savings[key] = reuse_savings(arms[label], arms[plain]) | {"paired": self._paired(label, plain)}
            if arm.think is True and (off := replace(arm, think=False).label) in arms:
                thinking[arm.family] = thinking_cost(arms[label], arms[off]) | {"paired": self._paired(label, off)}
            if arm.think_budget is not None and (free := replace(arm, think_budget=None).label) in arms:
                cut = statistics.fmean(r.reasoning_cut for r in self.records(label)) if self.records(label) else None
                budgets[label] = thinking_cost(arms[label], arms[free]) | {
                    "paired": self._paired(label, free), "against": free, "cut_share": cut}
        from localchat.bench.depth import summarize
        from localchat.bench.distance import distance_summary

        return {"arms": arms, "growth": growth, "history_on_vs_off": comparisons, "kv_reuse": savings,
                "think_on_vs_off": thinking, "think_budget_vs_none": budgets, "policies": policy_summary(self.turns),
                "intervals": {arm: arm_intervals(self.records(arm)) for arm in self.arms},
                "no_interval": no_interval(self.turns) if self.turns else None,
                "depth": summarize(self.depth) if self.depth else None, "distance": distance_summary(self.turns),
                "policy_vs_full": self._policies_vs_full()}

    def _policies_vs_full(self) -> dict:
        """Each history policy against ``full`` on the same backend, turn by turn."""
        full = {r.backend: r.arm for r in self.turns if r.policy == "full"}
        return {arm: self._paired(arm, full[backend]) for arm, backend in
                dict.fromkeys((r.arm, r.backend) for r in self.turns if r.policy not in (None, "full"))
                if backend in full}

    def _paired(self, a: str, b: str) -> dict:
        return paired(self.records(a), self.records(b))

    def _arm_settings(self) -> dict[str, Arm]:
        return {r.arm: Arm(r.backend, r.history, r.cache_reuse, r.think, think_budget=r.think_budget)
                for r in self.turns if r.policy is None}

    def as_dict(self) -> dict:
        return {"schema": "localchat.bench.arms/2", "environment": self.environment, "settings": self.settings,
                "summary": self.summary(), "turns": [asdict(r) for r in self.turns],
                "depth": [asdict(p) for p in self.depth]}
