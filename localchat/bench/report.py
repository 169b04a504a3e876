"""A bench result rendered: the summary rows and lines, Markdown, CSV, JSON and the plot.

``--out DIR`` writes ``results.json`` (schema ``localchat.bench/1``: environment, settings, summary
and every turn), ``turns.csv`` (one row per turn, the same fields as ``turns`` in the JSON) and
``summary.md`` (the tables and the command that re-runs the run); ``--plot`` adds a PNG.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from localchat import files
from localchat.bench.arms import BenchResult, TurnRecord
from localchat.environment import busy
from localchat.intervals import Interval, bootstrap, p_text
from localchat.plots import finish_figure


def _f(value: Any, spec: str = ".3f", scale: float = 1.0) -> str:
    return "–" if value is None else format(value * scale, spec)


def interval_text(interval: dict, spec: str, scale: float = 1.0) -> str:
    """``37.2 [35.1, 40.3]``: a figure and its interval (the figure alone when there is none)."""
    return _f(interval["value"], spec, scale) + _bounds(interval, spec, scale)


def _bounds(interval: dict, spec: str, scale: float = 1.0) -> str:
    """`` [35.1, 40.3]``: a 95 % interval after its figure; nothing when there is none."""
    if interval["low"] is None:
        return ""
    return f" [{_f(interval['low'], spec, scale)}, {_f(interval['high'], spec, scale)}]"


def points(difference: float | None) -> str:
    """A difference of two accuracies, in percentage points (``+48 points``), not a percentage."""
    return "–" if difference is None else f"{difference * 100:+.0f} points"


SUMMARY_HEADERS = ["arm", "accuracy", "TTFT med ms", "TTFT p90 ms", "TTFA med ms", "think tok/turn", "total med s",
                   "tok/s med", "tok/s p90", "prompt tokens", "cached", "cache misses"]
THINKING_HEADERS = ("TTFA med ms", "think tok/turn")  # shown only when some turn reasoned


def summary_table(result: BenchResult) -> tuple[list[str], list[list[str]]]:
    """The summary's headers and one row an arm; without reasoning, no thinking columns."""
    rows = []
    summary = result.summary()
    for arm, s in summary["arms"].items():
        i = summary["intervals"][arm]
        acc = f"{_f(s['accuracy'], '.0%')} ({s['correct']}/{s['scored']}){_bounds(i['accuracy'], '.0%')}"
        think = f"{'~' if s['reasoning_estimated'] else ''}{_f(s['reasoning_tokens_mean'], '.1f')}"
        rows.append([arm, acc, _f(s["ttft_median_s"], ".1f", 1e3) + _bounds(i["ttft_median_s"], ".1f", 1e3),
                     _f(s["ttft_p90_s"], ".1f", 1e3), _f(s["ttfa_median_s"], ".1f", 1e3), think,
                     _f(s["total_s_median"], ".2f") + _bounds(i["total_s_median"], ".2f"),
                     _f(s["decode_tps_median"], ".1f") + _bounds(i["decode_tps_median"], ".1f"),
                     _f(s["decode_tps_p90"], ".1f"), str(s["prompt_tokens_total"]), str(s["cached_tokens_total"]),
                     str(s["cache_misses"])])
    if any(t.reasoning_tokens for t in result.turns):
        return SUMMARY_HEADERS, rows
    keep = [i for i, header in enumerate(SUMMARY_HEADERS) if header not in THINKING_HEADERS]
    return [SUMMARY_HEADERS[i] for i in keep], [[row[i] for i in keep] for row in rows]


POLICY_HEADERS = ["policy", "early facts", "recent facts", "prompt tok/turn", "with compactions", "prefilled tok/turn",
                  "TTFT med ms", "compactions", "their tokens", "their time s"]


def policy_rows(result: BenchResult) -> list[list[str]]:
    """One row per history policy: what it buys (early and recent recall) and what it costs."""
    def acc(a: dict) -> str:
        return f"{_f(a['accuracy'], '.0%')} ({a['correct']}/{a['scored']})"

    return [[arm, acc(p["early"]), acc(p["recent"]), _f(p["prompt_tokens_mean"], ".0f"),
             _f(p["all_tokens_per_turn"], ".0f"), _f(p["prefilled_tokens_mean"], ".0f"),
             _f(p["ttft_median_s"], ".1f", 1e3), str(p["compactions"]),
             str(p["compaction_tokens"]), _f(p["compaction_s"], ".2f")]
            for arm, p in result.summary()["policies"].items()]


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "| " + " | ".join(headers) + " |\n|" + "---|" * len(headers) + "\n"
    return head + "".join("| " + " | ".join(row) + " |\n" for row in rows)


def paired_line(label: str, p: dict, ratios: tuple[tuple[str, str], ...] = (("prompt_token_ratio", "prompt tokens"),
                                                                           ("ttft_ratio", "TTFT"))) -> str:
    """``history on vs off: accuracy +48 points [+39, +57] (McNemar p < 0.001) · TTFT ×1.32 [1.21, 1.44]``,
    saying plainly where the run cannot tell a difference from noise."""
    parts = []
    accuracy = p["accuracy_difference"]
    if accuracy["value"] is not None:
        shown = f"{accuracy['value'] * 100:+.0f} points"
        if accuracy["low"] is not None:
            shown += f" [{accuracy['low'] * 100:+.0f}, {accuracy['high'] * 100:+.0f}]"
        test = "" if accuracy["low"] is None or p["discordant_turns"] is None else f" ({p_text(p['mcnemar_p'])})"
        unsure = ": no difference this run can show" if accuracy["low"] is not None and \
            accuracy["low"] <= 0 <= accuracy["high"] else ""
        parts.append(f"accuracy {shown}{test}{unsure}")
    for key, name in ratios:
        ratio = p[key]
        unsure = ": no difference this run can show" if ratio["low"] is not None and \
            ratio["low"] <= 1 <= ratio["high"] else ""
        parts.append(f"{name} ×{interval_text(ratio, '.2f')}{unsure}")
    return f"{label}: " + " · ".join(parts)


def comparison_lines(result: BenchResult) -> list[str]:
    summary = result.summary()
    lines = [f"intervals: {summary['no_interval']}"] if summary["no_interval"] else []
    if said := busy_line(result.environment.get("conditions")):
        lines.append(said)
    for backend, c in summary["history_on_vs_off"].items():
        lines.append(paired_line(f"{backend}: history on vs off", c["paired"]))
    for arm, p in summary["policy_vs_full"].items():
        lines.append(paired_line(f"{arm} vs full", p))
    for arm, g in summary["growth"].items():
        if arm in summary["policies"]:
            continue  # a trimmed history has no one growth to fit
        if g and "history-on" in arm:
            lines.append(f"{arm}: prompt tokens at turn n ≈ {g['S']:.1f} + {g['T']:.1f}·n (R² {g['r2']:.3f}, "
                         f"±{g['mean_abs_error_tokens']:.1f} a turn); longest conversation ({g['longest_turns']} "
                         f"turns): {g['measured_total']} input tokens measured vs {g['model_total']:.0f} "
                         "by N·S + T·N(N+1)/2")
        elif g:
            lines.append(f"{arm}: prompt tokens per turn slope {g['T']:+.1f} (flat without history)")
    for arm, a in summary["arms"].items():
        if a["tool_calls_total"]:
            lines.append(f"{arm}: tools: {a['tool_calls_total']} calls in {a['tool_rounds_total']} rounds, "
                         f"{a['tool_s_total']:.2f}s inside the tools (apart from model time); calls and results add "
                         f"{_f(a['tool_prompt_tokens_mean'], '.0f')} prompt tokens a turn")
    for backend, k in summary["kv_reuse"].items():
        lines.append(f"{backend}: KV reuse prefilled {_f(k['prefilled_ratio'], '.0%')} of the tokens "
                     f"no-reuse did ({k['prefilled_tokens_saved']} saved); "
                     + paired_line("reuse vs none", k["paired"], (("ttft_ratio", "TTFT"),)))
    for family, t in summary["think_on_vs_off"].items():
        lines.append(f"{family}: thinking on vs off: accuracy {points(t['accuracy_difference'])}, "
                     f"TTFT ×{_f(t['ttft_ratio'], '.2f')}, time to first answer ×{_f(t['ttfa_ratio'], '.2f')}, "
                     f"output tokens ×{_f(t['completion_token_ratio'], '.2f')} "
                     f"({_f(t['reasoning_tokens_per_turn'], '.1f')} reasoning tokens a turn), "
                     f"total time a turn ×{_f(t['total_time_ratio'], '.2f')}; "
                     + paired_line("paired", t["paired"], (("ttft_ratio", "TTFT"),)))
    for arm, t in summary.get("think_budget_vs_none", {}).items():
        lines.append(f"{arm} vs no budget: reasoning cut on {_f(t['cut_share'], '.0%')} of turns, accuracy "
                     f"{points(t['accuracy_difference'])}, time to first answer ×{_f(t['ttfa_ratio'], '.2f')}, "
                     f"total time a turn ×{_f(t['total_time_ratio'], '.2f')} "
                     f"({_f(t['reasoning_tokens_per_turn'], '.1f')} reasoning tokens a turn); "
                     + paired_line("paired", t["paired"], (("ttft_ratio", "TTFT"),)))
    return lines


def busy_line(conditions: dict | None) -> str | None:
    """One line when the machine was busy at the start or the end: the figures are flagged."""
    if not conditions:
        return None
    busy_at = [f"{when} (load {c['load_1m']} on {c['cores']} cores)" for when, c in conditions.items() if busy(c)]
    return f"caution: the machine was busy at the {' and the '.join(busy_at)}: timings may be slower and noisier " \
           "than this machine gives when idle" if busy_at else None


def environment_line(result: BenchResult) -> str:
    e = result.environment
    return (f"{e['model']} ({e['quantization_bits'] or '?'}-bit) on {e['hardware']}, mlx {e['mlx_version']} "
            f"({e['mlx_device']}), mlx-lm {e['mlx_lm_version']}, localchat {e['localchat_version']}"
            f"{' @ ' + e['git_commit'] if e['git_commit'] else ''}; temperature {e['temperature']}, "
            f"seed {e['seed']}, max tokens {e['max_tokens']}, {e['date']}")


DEPTH_HEADERS = ["backend · prompt", "depth", "context tokens", "TTFT med ms", "prefill tok/s", "decode tok/s"]


def depth_rows(result: BenchResult) -> list[list[str]]:
    """One row per backend, kind and depth of a ``--depth`` sweep, medians with their intervals."""
    sweep = result.summary()["depth"] or {}
    return [[series, str(p["depth"]), str(p["context_tokens"]), interval_text(p["ttft_s"], ".1f", 1e3),
             interval_text(p["prefill_tps"], ".0f"), interval_text(p["decode_tps"], ".1f")]
            for series, s in sweep.items() for p in s["points"]]


def distance_table(result: BenchResult) -> tuple[list[str], list[list[str]]] | None:
    """Recall by distance: one row an arm, one column a distance, accuracy with its interval."""
    sweep = result.summary()["distance"]
    if not sweep:
        return None
    distances = sorted({row["distance"] for rows in sweep.values() for row in rows})
    headers = ["recall after k turns", *[f"k={k}" for k in distances]]
    rows = []
    for arm, found in sweep.items():
        by_k = {row["distance"]: row for row in found}
        rows.append([arm, *[f"{by_k[k]['correct']}/{by_k[k]['asked']}{_bounds(by_k[k]['accuracy'], '.0%')}"
                            if k in by_k else "–" for k in distances]])
    return headers, rows


def depth_lines(result: BenchResult) -> list[str]:
    """TTFT's fitted growth with the context, uncached against cached."""
    sweep = result.summary()["depth"] or {}
    return [f"{series}: TTFT grows {_f(s['growth_ms_per_1k'], '+.1f')} ms per 1,000 tokens of context "
            "(least squares over every point)" for series, s in sweep.items()]


def to_markdown(result: BenchResult) -> str:
    if result.depth:
        return "\n".join(["# localchat bench --depth", "", f"Measured on: {environment_line(result)}", "",
                          _table(DEPTH_HEADERS, depth_rows(result)), *[f"- {line}" for line in depth_lines(result)],
                          "", "Re-run with:", "", f"    {result.environment['command']}", ""])
    policies = policy_rows(result)
    table = _table(*summary_table(result))
    if policies:
        table = "## History policies\n\n" + _table(POLICY_HEADERS, policies) + "\n## Every arm\n\n" + table
    if (distances := distance_table(result)) is not None:
        table += "\n## Recall by distance\n\n" + _table(*distances)
    per_script = ["", "| arm | script | accuracy |", "|---|---|---|"]
    for arm, s in result.summary()["arms"].items():
        for script, a in s["per_script_accuracy"].items():
            per_script.append(f"| {arm} | {script} | {_f(a['accuracy'], '.0%')} ({a['correct']}/{a['scored']}) |")
    return "\n".join([
        "# localchat bench", "", f"Measured on: {environment_line(result)}", "", table,
        *[f"- {line}" for line in comparison_lines(result)], *per_script, "",
        "Re-run with:", "", f"    {result.environment['command']}", "",
    ])


def to_csv(result: BenchResult) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[f.name for f in fields(TurnRecord)])
    writer.writeheader()
    for record in result.turns:
        writer.writerow(asdict(record))
    return buffer.getvalue()


def to_json(result: BenchResult) -> str:
    return json.dumps(result.as_dict(), indent=2, ensure_ascii=False)


def per_turn_medians(records: list[TurnRecord], key: str) -> dict[int, Interval]:
    """Each turn number's median over the conversations that reached it, with its bootstrap
    interval (each conversation's turn is one value; one value gives none)."""
    by_turn: dict[int, list[list[float]]] = {}
    for r in records:
        value = getattr(r, key)
        if value is not None:
            by_turn.setdefault(r.turn, []).append([value])
    return {n: bootstrap(v) for n, v in sorted(by_turn.items())}


def write_plot(result: BenchResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if result.depth:
        return write_depth_plot(result, path, plt)
    if result.summary()["policies"]:
        return write_policy_plot(result, path, plt)
    thinking = any(r.reasoning_tokens for r in result.turns)
    fig, axes = plt.subplots(1, 3 if thinking else 2, figsize=(15 if thinking else 11, 4.2))
    panels = [("ttft_s", 1e3, "TTFT per turn (median)", "ms"),
              ("prompt_tokens", 1, "prompt tokens per turn (median)", "tokens")]
    if thinking:
        panels.insert(1, ("ttfa_s", 1e3, "time to first answer token per turn (median)", "ms"))
    for ax, (key, scale, title, unit) in zip(axes, panels):
        for arm in result.arms:
            values = per_turn_medians(result.records(arm), key)
            y = [(v.value or 0.0) * scale for v in values.values()]
            below = [(v.value - v.low) * scale if v.value is not None and v.low is not None else 0.0
                     for v in values.values()]
            above = [(v.high - v.value) * scale if v.value is not None and v.high is not None else 0.0
                     for v in values.values()]
            ax.errorbar(list(values), y, yerr=[below, above], marker="o", capsize=2, label=arm)
        ax.set(title=title + " · 95 % interval", xlabel="turn", ylabel=unit)
    _finish(fig, axes, f"localchat bench · {environment_line(result)}", path, plt)


def write_depth_plot(result: BenchResult, path: Path, plt) -> None:
    """TTFT and prefill speed against the context already there, uncached and cached, error bars
    from the repeats."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for series, s in (result.summary()["depth"] or {}).items():
        for ax, key, scale in ((axes[0], "ttft_s", 1e3), (axes[1], "prefill_tps", 1)):
            points = [p for p in s["points"] if p[key]["value"] is not None]
            x = [p["context_tokens"] for p in points]
            y = [p[key]["value"] * scale for p in points]
            low = [(p[key]["value"] - (p[key]["low"] if p[key]["low"] is not None else p[key]["value"])) * scale
                   for p in points]
            high = [((p[key]["high"] if p[key]["high"] is not None else p[key]["value"]) - p[key]["value"]) * scale
                    for p in points]
            ax.errorbar(x, y, yerr=[low, high], marker="o", capsize=3, label=series)
    axes[0].set(title="TTFT of the next turn (median, 95 % interval)", xlabel="tokens of conversation in context",
                ylabel="ms")
    axes[1].set(title="prefill speed (median, 95 % interval)", xlabel="tokens of conversation in context",
                ylabel="tokens/s")
    _finish(fig, axes, f"localchat bench --depth · {environment_line(result)}", path, plt)


def write_outputs(result: BenchResult, out: Path) -> list[Path]:
    return files.write_outputs(out, {"results.json": to_json(result), "turns.csv": to_csv(result),
                                     "summary.md": to_markdown(result)})


def write_policy_plot(result: BenchResult, path: Path, plt) -> None:
    """Per policy: prompt and prefilled tokens by turn, and what it recalled (early vs recent facts)."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    policies = result.summary()["policies"]
    for arm in policies:
        records = result.records(arm)
        for ax, key in zip(axes[:2], ("prompt_tokens", "prefilled")):
            by_turn: dict[int, list[float]] = {}
            for r in records:
                by_turn.setdefault(r.turn, []).append(r.prompt_tokens - (r.cached_tokens if key == "prefilled" else 0))
            ax.plot(list(by_turn), [sum(v) / len(v) for v in by_turn.values()], marker=".", label=arm)
    axes[0].set(title="prompt tokens per turn (mean)", xlabel="turn", ylabel="tokens")
    axes[1].set(title="prefilled tokens per turn (mean)", xlabel="turn", ylabel="tokens")
    names = list(policies)
    for offset, fact in ((-0.2, "early"), (0.2, "recent")):
        axes[2].bar([i + offset for i in range(len(names))],
                    [(policies[a][fact]["accuracy"] or 0) * 100 for a in names],
                    width=0.4, label=f"{fact} facts")
    axes[2].set_xticks(range(len(names)), names, rotation=20, fontsize=8)
    axes[2].set(title="recall", ylabel="% correct", ylim=(0, 105))
    _finish(fig, axes, f"localchat bench --policy · {environment_line(result)}", path, plt)


def _finish(fig, axes, title: str, path: Path, plt) -> None:
    """Grid and legend on every panel, the run's environment as the title, then the file."""
    finish_figure(fig, axes, title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
