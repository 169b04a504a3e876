"""A load result rendered: the sweep table, Markdown, CSV, JSON and the plot.

``--out DIR`` writes ``results.json`` (schema ``localchat.load/2``: environment fingerprint, settings,
every run's figures with its pass, the sweep's knee and batching gain, with ``--repeat`` each run's
figures over the passes with intervals, and ``partial`` when the run was stopped),
``requests.csv`` (one row per request) and ``summary.md``; ``--plot`` adds a PNG.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from localchat import files
from localchat.load.metrics import RequestRecord
from localchat.load.sweep import LoadResult
from localchat.plots import finish_figure
from localchat.wording import count

TABLE_HEADERS = ["users", "history", "requests", "errors", "req/s", "out tok/s", "TTFT p50 ms", "TTFT p99 ms",
                 "TPOT p50 ms", "ITL p50 ms", "e2e p99 s", "goodput", "accuracy"]


def _f(value: Any, spec: str = ".1f", scale: float = 1.0) -> str:
    return "–" if value is None else format(value * scale, spec)


def load_table(result: LoadResult) -> tuple[list[str], list[list[str]]]:
    """The table's headers and one row a run; goodput only when an SLO was given (without one
    every request would count as good)."""
    rows = []
    passes = result.settings.get("repeat", 1) > 1
    for s in result.summaries():
        acc = s["accuracy"]
        shown = count(s["users"], "user") + (f" (pass {s['repeat'] + 1})" if passes else "") \
            + (" (partial)" if s["partial"] else "")
        rows.append([shown, s["history"], str(s["requests"]),
                     str(s["requests"] - s["ok"]), _f(s["request_rate"], ".2f"), _f(s["output_tps"]),
                     _f(s["ttft_s"]["p50"], ".0f", 1e3), _f(s["ttft_s"]["p99"], ".0f", 1e3),
                     _f(s["tpot_s"]["p50"], ".1f", 1e3), _f(s["itl_s"]["p50"], ".1f", 1e3),
                     _f(s["e2e_s"]["p99"], ".2f"), _f(s["goodput"]["share"], ".0%"),
                     f"{_f(acc['rate'], '.0%')} ({acc['correct']}/{acc['scored']})"])
    if result.settings["slo_ttft_s"] or result.settings["slo_tpot_s"]:
        return TABLE_HEADERS, rows
    keep = [i for i, header in enumerate(TABLE_HEADERS) if header != "goodput"]
    return [TABLE_HEADERS[i] for i in keep], [[row[i] for i in keep] for row in rows]


def sweep_lines(result: LoadResult) -> list[str]:
    """The knee, the batching gain, and how the prefix cache fills as the turns go by."""
    lines = []
    slo = result.settings["slo_ttft_s"]
    for history, figures in result.sweep().items():
        known = {users: g for users, g in figures["batching_gain"].items() if g is not None}
        gains = ("batching gain (output tokens/s ÷ 1 user) " + ", ".join(
            f"{count(int(users), 'user')} ×{g:.2f}" for users, g in known.items())) if known else \
            "no batching gain (it needs a 1-user run: --sweep 1,…)"
        knee = (f"TTFT p99 first exceeds {slo:g}s at {count(figures['knee_users'], 'user')}" if figures["knee_users"]
                else f"TTFT p99 stays within {slo:g}s" if slo else "no --slo-ttft: no knee")
        lines.append(f"history {history}: {gains}; {knee}")
    for s in result.summaries():
        if s["tools"]["rounds"]:
            lines.append(f"{count(s['users'], 'user')}, history {s['history']}: tools: {s['tools']['rounds']} rounds "
                         "of "
                         f"calls, {s['tools']['seconds']:.2f}s inside the tools (apart from model time); calls and "
                         f"results add {_f(s['tools']['prompt_tokens_per_request'], '.0f')} prompt tokens a request")
        if s["history"] == "on":
            hits = " · ".join(f"turn {n} {_f(t['cached_tokens_mean'], '.0f')}/{_f(t['prompt_tokens_mean'], '.0f')}"
                              for n, t in s["by_turn"].items())
            which = f" (pass {s['repeat'] + 1})" if result.settings.get("repeat", 1) > 1 else ""
            lines.append(f"{count(s['users'], 'user')}{which}, history on: cached/prompt tokens by turn: {hits}")
    return lines


FEWEST_FOR_INTERVAL = 5  # passes: as bench says of its repeats ("--repeat 5 gives 95 % intervals")


def repeated_lines(result: LoadResult) -> list[str]:
    """With ``--repeat``: each run's figures over the passes, median [95 % interval]."""
    def shown(interval: dict, spec: str, scale: float = 1.0) -> str:
        if interval["value"] is None:
            return "–"
        bounds = f" [{_f(interval['low'], spec, scale)}, {_f(interval['high'], spec, scale)}]" \
            if interval["low"] is not None else ""
        return _f(interval["value"], spec, scale) + bounds

    def kind(passes: int) -> str:  # two or three values have a range, not a 95 % interval worth the name
        return "median [95 % interval]" if passes >= FEWEST_FOR_INTERVAL else \
            f"median [the {passes} passes' range]; --repeat {FEWEST_FOR_INTERVAL} or more gives a 95 % interval"

    return [f"{count(r['users'], 'user')}, history {r['history']}, {r['passes']} passes ({kind(r['passes'])}): "
            f"out tok/s {shown(r['output_tps'], '.1f')} · req/s {shown(r['request_rate'], '.2f')} · TTFT p50 "
            f"{shown(r['ttft_p50_s'], '.0f', 1e3)} ms · TTFT p99 {shown(r['ttft_p99_s'], '.0f', 1e3)} ms · "
            f"accuracy {shown(r['accuracy'], '.0%')}" for r in result.repeated() or []]


def environment_line(result: LoadResult) -> str:
    e = result.environment
    return (f"{e['model']} at {e['server']}{' (launched here)' if e['launched'] else ''}, on {e['hardware']}, "
            f"mlx {e['mlx_version']}, mlx-lm {e['mlx_lm_version']}, localchat {e['localchat_version']}; "
            f"{e['batching']}; {e['date']}")


def to_markdown(result: LoadResult) -> str:
    headers, rows = load_table(result)
    head = "| " + " | ".join(headers) + " |\n|" + "---|" * len(headers) + "\n"
    body = "".join("| " + " | ".join(row) + " |\n" for row in rows)
    status = ["", "**Partial: the run was stopped before it finished.**"] if result.partial else []
    return "\n".join(["# localchat load", *status, "", f"Measured on: {environment_line(result)}", "",
                      head + body, *[f"- {line}" for line in [*sweep_lines(result), *repeated_lines(result)]], ""])


def to_csv(result: LoadResult) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[f.name for f in fields(RequestRecord)])
    writer.writeheader()
    for run in result.runs:
        for record in run.records:
            writer.writerow(asdict(record))
    return buffer.getvalue()


def write_outputs(result: LoadResult, out: Path) -> list[Path]:
    return files.write_outputs(out, {"results.json": json.dumps(result.as_dict(), indent=2, ensure_ascii=False),
                                     "requests.csv": to_csv(result), "summary.md": to_markdown(result)})


def write_plot(result: LoadResult, path: Path) -> None:
    """Throughput, and TTFT p50/p99, against the number of users, history on and off."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_tps, ax_ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    for history, color in (("on", "C0"), ("off", "C1")):  # one colour a history setting, in both panels
        runs = [s for s in result.summaries() if s["history"] == history]
        if not runs:
            continue
        users = [s["users"] for s in runs]
        ax_tps.plot(users, [s["output_tps"] or 0 for s in runs], color=color, marker="o", label=f"history {history}")
        for q, style in (("p50", "-"), ("p99", "--")):
            ax_ttft.plot(users, [(s["ttft_s"][q] or 0) * 1e3 for s in runs], style, color=color, marker="o",
                         label=f"history {history} {q}")
    if result.settings["slo_ttft_s"]:
        ax_ttft.axhline(result.settings["slo_ttft_s"] * 1e3, color="grey", linewidth=0.8, label="TTFT SLO")
    ax_tps.set(title="aggregate output tokens/s", xlabel="users", ylabel="tokens/s")
    ax_ttft.set(title="TTFT", xlabel="users", ylabel="ms")
    counts = sorted({s["users"] for s in result.summaries()})
    for ax in (ax_tps, ax_ttft):
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.minorticks_off()
    finish_figure(fig, (ax_tps, ax_ttft), f"localchat load · {environment_line(result)}")
    fig.savefig(path, dpi=110)
    plt.close(fig)
