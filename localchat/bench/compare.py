"""``localchat bench compare A B``: two runs' ``results.json`` side by side (two models, two machines,
two versions), each figure with its interval and each difference tested: turn by turn where the two
runs drew the same conversations (the same scripts and seed: every turn's question is the same),
run against run otherwise. Runs whose scripts or temperature differ are not comparable (``force``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from localchat.bench.uncertainty import arm_intervals, clusters, paired
from localchat.errors import UsageError
from localchat.files import read_json_setting
from localchat.intervals import cluster_mean, unpaired_difference, unpaired_ratio

SCHEMAS = ("localchat.bench.arms/1", "localchat.bench.arms/2")
MAX_TURNS = 20_000  # a long bench (--repeat 100 of the built-in scripts) writes ~8,000


@dataclass
class Run:
    path: Path
    environment: dict
    settings: dict
    turns: list[Any] = field(default_factory=list)

    @property
    def arms(self) -> list[str]:
        return list(dict.fromkeys(t.arm for t in self.turns))

    def records(self, arm: str) -> list[Any]:
        return [t for t in self.turns if t.arm == arm]

    @property
    def label(self) -> str:
        e = self.environment
        return f"{e.get('model', '?')} on {e.get('hardware', '?')}, localchat {e.get('localchat_version', '?')}" \
               f"{' @ ' + e['git_commit'] if e.get('git_commit') else ''}"


def load_run(path: Path) -> Run:
    """A ``results.json`` of any bench version (schema 1 or 2), or one usage line."""
    data = read_json_setting(path, "bench compare")
    if not isinstance(data, dict) or data.get("schema") not in SCHEMAS or not isinstance(data.get("turns"), list):
        raise UsageError(f"bench compare: {path}: not a bench results.json (its schema: "
                         f"{data.get('schema') if isinstance(data, dict) else type(data).__name__})")
    if len(data["turns"]) > MAX_TURNS:
        raise UsageError(f"bench compare: {path}: {len(data['turns']):,} turns, over the {MAX_TURNS:,} a comparison "
                         "bootstraps in reasonable time")
    for key in ("environment", "settings"):
        if not isinstance(data.get(key, {}), dict):
            raise UsageError(f"bench compare: {path}: {key} must be an object")
    _check_conditions((data.get("environment") or {}).get("conditions"), path)
    turns = [SimpleNamespace(**_checked_turn(t, i, path)) for i, t in enumerate(data["turns"], 1)]
    return Run(path=path, environment=data.get("environment") or {}, settings=data.get("settings") or {}, turns=turns)


TURN_FIELDS: dict[str, tuple[type, ...]] = {  # what compare reads of a turn, and what each must be
    "arm": (str,), "script": (str,), "user": (str,), "repeat": (int,), "conversation": (int,), "turn": (int,),
    "prompt_tokens": (int,), "scored": (bool,), "correct": (bool, type(None)), "ttft_s": (float, int, type(None)),
    "decode_tps": (float, int, type(None)), "total_s": (float, int)}


MAX_COUNT = 10**12  # a count (tokens, turns, cores) past any run's


def _number(value: Any, kinds: tuple[type, ...]) -> bool:
    """A finite number of one of ``kinds`` within any run's size (a 401-digit count is not one)."""
    import math

    if isinstance(value, bool) or not isinstance(value, kinds):
        return False
    return abs(value) <= MAX_COUNT if isinstance(value, int) else isinstance(value, float) and math.isfinite(value)


def _check_conditions(conditions: Any, path: Path) -> None:
    """The machine's load at the start and the end, as bench writes it, or one usage line."""
    if conditions is None:
        return
    fine = isinstance(conditions, dict) and all(
        isinstance(state, dict) and all(state.get(k) is None or _number(state.get(k), (int, float))
                                        for k in ("load_1m", "cores"))
        for state in conditions.values())
    if not fine:
        raise UsageError(f"bench compare: {path}: environment.conditions must map start and end to "
                         "{load_1m, cores} numbers")


def _checked_turn(turn: Any, number: int, path: Path) -> dict:
    """A turn of a results.json as compare reads it; anything else is one usage line naming it."""
    if not isinstance(turn, dict):
        raise UsageError(f"bench compare: {path}: turn {number} is not an object")
    for name, kinds in TURN_FIELDS.items():
        value = turn.get(name)
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        fine = _number(value, kinds) if numeric else isinstance(value, kinds) and (
            not isinstance(value, bool) or bool in kinds)
        if name not in turn or not fine:
            wanted = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise UsageError(f"bench compare: {path}: turn {number}: {name} must be {wanted} (a finite number where "
                             f"one is asked), not {value!r}"[:300])
    return turn


def comparable(a: Run, b: Run, force: bool) -> list[str]:
    """What differs between the two runs' conditions; a usage error when it makes them not
    comparable (scripts, temperature) and ``force`` is not given."""
    keys = (("scripts", a.settings.get("scripts"), b.settings.get("scripts")),
            ("temperature", a.environment.get("temperature"), b.environment.get("temperature")))
    differ = [f"{name}: {x} vs {y}" for name, x, y in keys if x != y]
    if differ and not force:
        raise UsageError(f"bench compare: the runs differ in {'; '.join(differ)}: their figures do not measure the "
                         "same thing (--force compares them anyway)")
    return differ


def same_draws(a: list[Any], b: list[Any]) -> bool:
    """The two runs asked the same questions in the same conversations (the same codes drawn)."""
    def asked(records: list[Any]) -> dict:
        return {(r.script, r.repeat, r.conversation, r.turn): r.user for r in records}

    first, second = asked(a), asked(b)
    return bool(first) and first == second


def compare_arm(a: list[Any], b: list[Any]) -> dict:
    """One arm in both runs: each run's figures with intervals, and B against A."""
    if same_draws(a, b):
        return {"paired": True, "a": arm_intervals(a), "b": arm_intervals(b), "b_vs_a": paired(b, a)}
    return {"paired": False, "a": arm_intervals(a), "b": arm_intervals(b), "b_vs_a": unpaired(b, a)}


def unpaired(b: list[Any], a: list[Any]) -> dict:
    """Run against run: the accuracy difference (the two clustered intervals combined), the TTFT
    ratio of medians and the prompt-token ratio of means, each run bootstrapped on its own."""
    import statistics

    accuracy = unpaired_difference(cluster_mean(_values(b, _correct), share=True),
                                   cluster_mean(_values(a, _correct), share=True))
    return {"accuracy_difference": accuracy.as_dict(),
            "ttft_ratio": unpaired_ratio(_values(b, lambda r: r.ttft_s), _values(a, lambda r: r.ttft_s)).as_dict(),
            "prompt_token_ratio": unpaired_ratio(_values(b, lambda r: r.prompt_tokens),
                                                 _values(a, lambda r: r.prompt_tokens), statistics.fmean).as_dict(),
            "mcnemar_p": None, "discordant_turns": None}


def _correct(record: Any) -> float | None:
    return float(bool(record.correct)) if record.scored else None


def _values(records: list[Any], value: Any) -> list[list[float]]:
    """Each conversation's values (the unit every interval resamples)."""
    return list(clusters(records, value).values())


def compare_runs(first: Path, second: Path, force: bool = False) -> dict:
    """The comparison of two runs (a ``results.json`` each, or the ``--out`` directories holding one)."""
    a, b = (load_run(p / "results.json" if p.is_dir() else p) for p in (first, second))
    differ = comparable(a, b, force)
    shared = [arm for arm in a.arms if arm in b.arms]
    if not shared:
        raise UsageError(f"bench compare: the runs share no arm ({', '.join(a.arms)} vs {', '.join(b.arms)})")
    from localchat.bench.report import busy_line

    return {"a": {"path": str(a.path), "run": a.label, "busy": busy_line(a.environment.get("conditions"))},
            "b": {"path": str(b.path), "run": b.label, "busy": busy_line(b.environment.get("conditions"))},
            "differences_in_settings": differ,
            "arms": {arm: compare_arm(a.records(arm), b.records(arm)) for arm in shared},
            "only_in": {"a": [arm for arm in a.arms if arm not in b.arms],
                        "b": [arm for arm in b.arms if arm not in a.arms]}}


def compare_lines(report: dict) -> list[str]:
    """The comparison in words: each arm's figures in A and B with intervals, then B against A."""
    from localchat.bench.report import interval_text, paired_line

    lines = [f"A: {report['a']['run']} ({report['a']['path']})", f"B: {report['b']['run']} ({report['b']['path']})"]
    lines += [f"compared anyway (--force): {d}" for d in report["differences_in_settings"]]
    lines += [f"caution: run {run.upper()} {said.removeprefix('caution: ')}; its timings do not compare"
              for run in ("a", "b") if (said := report[run].get("busy"))]
    for arm, c in report["arms"].items():
        how = "the same conversations: turn by turn" if c["paired"] else "different draws: run against run"
        lines.append(f"{arm} ({how})")
        for run in ("a", "b"):
            i = c[run]
            lines.append(f"  {run.upper()}: accuracy {interval_text(i['accuracy'], '.0%')} · TTFT median "
                         f"{interval_text(i['ttft_median_s'], '.1f', 1e3)} ms · decode median "
                         f"{interval_text(i['decode_tps_median'], '.1f')} tok/s")
        lines.append("  " + paired_line("B vs A", c["b_vs_a"]))
    lines += [f"{arm}: only in run {run.upper()}, nothing to compare it with"
              for run in ("a", "b") for arm in report["only_in"][run]]
    return lines
