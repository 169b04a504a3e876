"""``localchat bench`` around the core: open the arms' backends, show progress, render and write.

``--out DIR`` writes ``results.json`` (schema ``localchat.bench/1``: environment, settings, summary
and every turn), ``turns.csv`` (one row per turn, the same fields as ``turns`` in the JSON) and
``summary.md`` (the tables and the command that re-runs the run); ``--plot`` adds a PNG.
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import io
import json
import shlex
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from localchat.backends import GenerationParams
from localchat.bench import Arm, BenchPlan, BenchResult, TurnRecord, run_arm
from localchat.benchscript import BenchScript, builtin_scripts, load_script, script_from_session
from localchat.environment import collect
from localchat.errors import LocalchatError, UsageError
from localchat.registry import DEFAULT_MODEL, ModelRef, local_dir, quantization_bits, resolve


@dataclass(frozen=True)
class BenchOptions:
    model: str | None = None
    backend: str = "inproc"  # inproc | server | both
    history: str = "both"  # on | off | both
    scripts: tuple[Path, ...] = ()
    repeat: int = 1
    warmup: int = 0
    temperature: float = 0.0
    seed: int = 0
    max_tokens: int = 64
    no_cache_reuse: bool = False
    base_url: str | None = None
    out: Path | None = None
    format: str = "table"
    plot: Path | None = None
    replay: tuple[str, ...] = ()  # saved session names


def arms_for(opts: BenchOptions) -> list[Arm]:
    backends = ["inproc", "server"] if opts.backend == "both" else [opts.backend]
    histories = [True, False] if opts.history == "both" else [opts.history == "on"]
    arms = [Arm(b, h) for b in backends for h in histories]
    if opts.no_cache_reuse and "inproc" in backends and True in histories:
        arms.insert(1, Arm("inproc", True, cache_reuse=False))
    return arms


def check_plot_available(plot: Path | None) -> None:
    if plot is None:
        return
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib: run with `uv run --extra plot localchat bench …`") from None


def environment_block(ref: ModelRef, tokenizer: Any, opts: BenchOptions) -> dict:
    env = collect()
    template = getattr(tokenizer, "chat_template", None) or ""
    path = None if ref.kind == "hub" else Path(ref.location)
    return env.as_dict() | {
        "hardware": env.hardware_label,
        "model": ref.id, "model_source": ref.location,
        "quantization_bits": quantization_bits(path) if path else None,
        "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest()[:16] if template else None,
        "temperature": opts.temperature, "seed": opts.seed, "max_tokens": opts.max_tokens,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": rerun_command(opts),
    }


def rerun_command(opts: BenchOptions) -> str:
    """The command line that repeats this run (same scripts, seed, temperature, arms)."""
    args = ["localchat", "bench", "--model", ref_name(opts), "--backend", opts.backend,
            "--history", opts.history, "--repeat", str(opts.repeat), "--warmup", str(opts.warmup),
            "--temperature", str(opts.temperature), "--seed", str(opts.seed),
            "--max-tokens", str(opts.max_tokens)]
    for script in opts.scripts:
        args += ["--script", str(script)]
    for name in opts.replay:
        args += ["--replay", name]
    if opts.no_cache_reuse:
        args.append("--no-cache-reuse")
    if opts.base_url:
        args += ["--base-url", opts.base_url]
    return shlex.join(args)


def ref_name(opts: BenchOptions) -> str:
    return opts.model or DEFAULT_MODEL


class ArmBackends:
    """Opens each arm's backend once (one loaded model, one server) and closes them all."""

    def __init__(self, ref: ModelRef, opts: BenchOptions, console: Console):
        self.ref, self.opts, self.console = ref, opts, console
        self.model = self.tokenizer = self.server = None
        self.opened: dict[tuple[str, bool], Any] = {}

    def for_arm(self, arm: Arm):
        key = (arm.backend, arm.cache_reuse)
        if key not in self.opened:
            self.opened[key] = self._inproc(arm.cache_reuse) if arm.backend == "inproc" else self._server()
        return self.opened[key]

    def _inproc(self, cache_reuse: bool):
        from localchat.backends.inproc import InProcessBackend, load_inproc

        if self.model is None:
            loaded = load_inproc(self.ref, local_dir(self.ref))
            self.model, self.tokenizer = loaded.model, loaded.tokenizer
        return InProcessBackend(self.model, self.tokenizer, self.ref.id,
                                chat_template_kwargs=self.ref.chat_template_kwargs, cache_reuse=cache_reuse)

    def _server(self):
        from localchat.backends.openai_http import backend_for
        from localchat.server import free_port
        from localchat.serving import start_ready

        if self.opts.base_url:
            backend = backend_for(self.opts.base_url, self.ref)
            _check_reachable(backend)
            return backend
        self.server = start_ready(self.ref, "127.0.0.1", free_port(), None, (), self.console)
        return backend_for(self.server.base_url, self.ref)

    def close(self) -> None:
        for backend in self.opened.values():
            backend.close()
        if self.server is not None:
            self.server.stop()


def _check_reachable(backend) -> None:
    import httpx

    from localchat.backends.openai_http import describe_http_error

    try:
        backend.client.get("models", timeout=5.0)
    except httpx.HTTPError as exc:
        raise LocalchatError(describe_http_error(exc, backend.url)) from None


def bench_scripts(opts: BenchOptions) -> list[BenchScript]:
    """--script files and --replay sessions; the built-in scripts when neither is given."""
    from localchat.sessions import default_store

    replays = []
    for name in opts.replay:
        saved = default_store().load(name)
        replays.append(script_from_session(saved.name, saved.system, [t.user for t in saved.turns]))
    paths = opts.scripts or (() if replays else tuple(builtin_scripts()))
    return [load_script(p) for p in paths] + replays


def run_bench(opts: BenchOptions, console: Console) -> BenchResult:
    check_plot_available(opts.plot)
    scripts = bench_scripts(opts)
    if not scripts:
        raise UsageError("no bench scripts: pass --script FILE")
    ref = resolve(opts.model or DEFAULT_MODEL)
    params = GenerationParams(temperature=opts.temperature, max_tokens=opts.max_tokens, seed=opts.seed)
    bench = BenchPlan(scripts, opts.repeat, opts.warmup, params, opts.seed)
    arms = arms_for(opts)
    per_arm = (bench.repeat + bench.warmup) * sum(len(t) for s in scripts for t in s.conversations)
    backends = ArmBackends(ref, opts, console)
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=True) as progress:
            task = progress.add_task("starting", total=per_arm * len(arms))

            def on_turn(arm: str, repeat: int, script: str, turn: int) -> None:
                label = "warm-up" if repeat < 0 else f"repeat {repeat + 1}/{bench.repeat}"
                progress.update(task, advance=1, description=f"{arm} · {label} · {script} turn {turn}")

            turns: list[TurnRecord] = []
            for arm in arms:
                turns += run_arm(backends.for_arm(arm), arm, bench, on_turn)
        tokenizer = backends.tokenizer or _local_tokenizer(ref)
    finally:
        backends.close()
    settings = asdict(opts) | {"arms": [a.label for a in arms], "scripts": [s.path for s in scripts]}
    settings = json.loads(json.dumps(settings, default=str))
    return BenchResult(environment_block(ref, tokenizer, opts), settings, turns)


def _local_tokenizer(ref: ModelRef):
    try:
        from mlx_lm.utils import load_tokenizer

        return load_tokenizer(local_dir(ref))
    except Exception:  # only for the template hash; a remote-only model has none here
        return None


# ---- rendering -------------------------------------------------------------------------------

def _f(value: Any, spec: str = ".3f", scale: float = 1.0) -> str:
    return "–" if value is None else format(value * scale, spec)


def summary_rows(result: BenchResult) -> list[list[str]]:
    rows = []
    for arm, s in result.summary()["arms"].items():
        acc = f"{_f(s['accuracy'], '.0%')} ({s['correct']}/{s['scored']})"
        rows.append([arm, acc, _f(s["ttft_median_s"], ".1f", 1e3), _f(s["ttft_p90_s"], ".1f", 1e3),
                     _f(s["decode_tps_median"], ".1f"), _f(s["decode_tps_p90"], ".1f"),
                     str(s["prompt_tokens_total"]), str(s["cached_tokens_total"]), str(s["cache_misses"])])
    return rows


SUMMARY_HEADERS = ["arm", "accuracy", "TTFT med ms", "TTFT p90 ms", "tok/s med", "tok/s p90",
                   "prompt tokens", "cached", "cache misses"]


def comparison_lines(result: BenchResult) -> list[str]:
    summary = result.summary()
    lines = []
    for backend, c in summary["history_on_vs_off"].items():
        lines.append(f"{backend}: history on vs off: accuracy {_f(c['accuracy_difference'], '+.0%')}, "
                     f"prompt tokens ×{_f(c['prompt_token_ratio'], '.2f')}, TTFT ×{_f(c['ttft_ratio'], '.2f')}")
    for arm, g in summary["growth"].items():
        if g and "history-on" in arm:
            lines.append(f"{arm}: prompt tokens at turn n ≈ {g['S']:.1f} + {g['T']:.1f}·n (R² {g['r2']:.3f}, "
                         f"±{g['mean_abs_error_tokens']:.1f} a turn); longest conversation ({g['longest_turns']} "
                         f"turns): {g['measured_total']} input tokens measured vs {g['model_total']:.0f} "
                         "by N·S + T·N(N+1)/2")
        elif g:
            lines.append(f"{arm}: prompt tokens per turn slope {g['T']:+.1f} (flat without history)")
    for backend, k in summary["kv_reuse"].items():
        lines.append(f"{backend}: KV reuse prefilled {_f(k['prefilled_ratio'], '.0%')} of the tokens "
                     f"no-reuse did ({k['prefilled_tokens_saved']} saved), TTFT ×{_f(k['ttft_ratio'], '.2f')}")
    return lines


def environment_line(result: BenchResult) -> str:
    e = result.environment
    return (f"{e['model']} ({e['quantization_bits'] or '?'}-bit) on {e['hardware']}, mlx {e['mlx_version']} "
            f"({e['mlx_device']}), mlx-lm {e['mlx_lm_version']}, localchat {e['localchat_version']}"
            f"{' @ ' + e['git_commit'] if e['git_commit'] else ''}; temperature {e['temperature']}, "
            f"seed {e['seed']}, max tokens {e['max_tokens']}, {e['date']}")


def show_table(result: BenchResult, console: Console) -> None:
    table = Table(*SUMMARY_HEADERS, title="localchat bench")
    for row in summary_rows(result):
        table.add_row(*row)
    console.print(table)
    for line in comparison_lines(result):
        console.print(line, markup=False, highlight=False)
    console.print(environment_line(result), style="dim", markup=False, highlight=False)


def to_markdown(result: BenchResult) -> str:
    head = "| " + " | ".join(SUMMARY_HEADERS) + " |\n|" + "---|" * len(SUMMARY_HEADERS) + "\n"
    body = "".join("| " + " | ".join(row) + " |\n" for row in summary_rows(result))
    per_script = ["", "| arm | script | accuracy |", "|---|---|---|"]
    for arm, s in result.summary()["arms"].items():
        for script, a in s["per_script_accuracy"].items():
            per_script.append(f"| {arm} | {script} | {_f(a['accuracy'], '.0%')} ({a['correct']}/{a['scored']}) |")
    return "\n".join([
        "# localchat bench", "", f"Measured on: {environment_line(result)}", "", head + body,
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


def per_turn_medians(records: list[TurnRecord], key: str) -> dict[int, float]:
    import statistics

    by_turn: dict[int, list[float]] = {}
    for r in records:
        value = getattr(r, key)
        if value is not None:
            by_turn.setdefault(r.turn, []).append(value)
    return {n: statistics.median(v) for n, v in sorted(by_turn.items())}


def write_plot(result: BenchResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_ttft, ax_tokens) = plt.subplots(1, 2, figsize=(11, 4.2))
    for arm in result.arms:
        records = result.records(arm)
        ttft = per_turn_medians(records, "ttft_s")
        tokens = per_turn_medians(records, "prompt_tokens")
        ax_ttft.plot(list(ttft), [v * 1e3 for v in ttft.values()], marker="o", label=arm)
        ax_tokens.plot(list(tokens), list(tokens.values()), marker="o", label=arm)
    ax_ttft.set(title="TTFT per turn (median)", xlabel="turn", ylabel="ms")
    ax_tokens.set(title="prompt tokens per turn (median)", xlabel="turn", ylabel="tokens")
    for ax in (ax_ttft, ax_tokens):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"localchat bench · {environment_line(result)[:150]}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(result: BenchResult, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in (("results.json", to_json(result)), ("turns.csv", to_csv(result)),
                       ("summary.md", to_markdown(result))):
        (out / name).write_text(text, encoding="utf-8")
        written.append(out / name)
    return written


def run_bench_cmd(opts: BenchOptions, console: Console, err: Console) -> int:
    """Results on ``console`` (stdout, so --format json/csv pipes); progress and notices on ``err``."""
    result = run_bench(opts, err)
    renderers = {"md": to_markdown, "json": to_json, "csv": to_csv}
    if opts.format == "table":
        show_table(result, console)
    else:
        console.out(renderers[opts.format](result), highlight=False)
    if opts.out:
        for path in write_outputs(result, opts.out):
            err.print(f"wrote {path}", style="dim")
    if opts.plot:
        write_plot(result, opts.plot)
        err.print(f"wrote {opts.plot}", style="dim")
    return 0
