"""``localchat bench`` around the core: open the arms' backends, show progress, render and write.

``--out DIR`` writes ``results.json`` (schema ``localchat.bench.arms/2``: environment, settings, summary
and every turn), ``turns.csv`` (one row per turn, the same fields as ``turns`` in the JSON) and
``summary.md`` (the tables and the command that re-runs the run); ``--plot`` adds a PNG.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from localchat.backends import GenerationParams
from localchat.bench.arms import Arm, BenchPlan, BenchResult, TurnRecord, run_arm
from localchat.bench.output_paths import check_outputs
from localchat.bench.script import (
    BenchScript,
    builtin_scripts,
    load_script,
    script_from_session,
    script_path,
)
from localchat.conversation.policy import parse_policies
from localchat.environment import collect, conditions
from localchat.errors import LocalchatError, UsageError
from localchat.fit.check import FitSettings, check_local, smaller_variants
from localchat.registry import (
    DEFAULT_MODEL,
    ModelRef,
    local_dir,
    quantization_bits,
    resolve,
)
from localchat.toolbox import check_tools, offer_tools, unattended_tools
from localchat.tools.settings import ToolSettings


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
    think: str | None = None  # on | off | both; None: the model's default, nothing sent
    think_budget: str | None = None  # --think-budget 0,16,none: one arm a budget (none: no budget)
    policy: str | None = None  # history policies side by side: full,window:N,budget:N,compact:N,pin:N
    tools: ToolSettings = field(default_factory=ToolSettings)  # --tools, --mcp: what every arm offers
    depth: str | None = None  # --depth 0,256,512: the context-depth sweep instead of the scripts
    distance: str | None = None  # --distance 0,2,4: recall by distance, the built-in family as the scripts
    memory_limit: int | None = None  # --memory-limit: the model is checked against it before it loads
    force: bool = False  # load it even when the check says it does not fit

    @property
    def fit(self) -> FitSettings:
        return FitSettings(memory_limit=self.memory_limit, force=self.force)


def arms_for(opts: BenchOptions) -> list[Arm]:
    backends = ["inproc", "server"] if opts.backend == "both" else [opts.backend]
    if opts.policy is not None:
        return [Arm(b, True, policy=p) for b in backends for p in parse_policies(opts.policy)]
    histories = [True, False] if opts.history == "both" else [opts.history == "on"]
    choices: dict[str | None, list[bool | None]] = {None: [None], "both": [True, False], "on": [True], "off": [False]}
    thinks = choices[opts.think]
    budgets = parse_budgets(opts.think_budget) if opts.think_budget is not None else (None,)
    arms = [Arm(b, h, think=t, think_budget=k) for b in backends for h in histories for t in thinks for k in budgets]
    if opts.no_cache_reuse and "inproc" in backends and True in histories:
        for think in reversed(thinks):
            arms.insert(1, Arm("inproc", True, cache_reuse=False, think=think))
    return arms


def parse_budgets(text: str) -> tuple[int | None, ...]:
    """``0,16,64,none``: each a thinking budget (``none``: an arm without one), once each, in order."""
    from localchat.grammar.think_budget import parse_budget

    parts = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not part for part in parts):
        raise UsageError("--think-budget: a comma-separated list of budgets, e.g. 0,16,64,none")
    try:
        budgets = [parse_budget(part if part != "none" else None) for part in parts]
    except ValueError as exc:
        raise UsageError(f"--think-budget: {exc}") from None
    if len(set(budgets)) != len(budgets):
        raise UsageError("--think-budget: each budget once")
    return tuple(budgets)


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
    if opts.think:
        args += ["--think", opts.think]
    if opts.think_budget:
        args += ["--think-budget", opts.think_budget]
    if opts.policy:
        args += ["--policy", opts.policy]
    if opts.depth:
        args += ["--depth", opts.depth]
    if opts.distance:
        args += ["--distance", opts.distance]
    for path in opts.tools.files:
        args += ["--tools", str(path)]
    for path in opts.tools.mcp:
        args += ["--mcp", str(path)]
    if opts.tools.mcp_only:
        args += ["--mcp-only", ",".join(opts.tools.mcp_only)]
    if opts.tools.offered:
        args.append("--approve-tools")
    if opts.base_url:
        args += ["--base-url", opts.base_url]
    return shlex.join(args)


def ref_name(opts: BenchOptions) -> str:
    return opts.model or DEFAULT_MODEL


class ArmBackends:
    """Opens each arm's backend once (one loaded model, one server) and closes them all."""

    def __init__(self, ref: ModelRef, opts: BenchOptions, on_status: Callable[[str], None], tools: Any = None):
        self.ref, self.opts, self.on_status, self.tools = ref, opts, on_status, tools
        self.model = self.tokenizer = self.server = None
        self.opened: dict[tuple[str, bool], Any] = {}

    def for_arm(self, arm: Arm):
        key = (arm.backend, arm.cache_reuse)
        if key not in self.opened:
            backend = self._inproc(arm.cache_reuse) if arm.backend == "inproc" else self._server()
            if self.tools is not None:
                offer_tools(backend, self.tools, self.on_status)
            self.opened[key] = backend
        return self.opened[key]

    def _inproc(self, cache_reuse: bool):
        from localchat.backends.inproc import InProcessBackend, load_inproc

        if self.model is None:
            path = local_dir(self.ref)
            check_local(self.ref.id, path, self.opts.fit, smaller_variants(self.ref))
            loaded = load_inproc(self.ref, path)
            self.model, self.tokenizer = loaded.model, loaded.tokenizer
        return InProcessBackend(self.model, self.tokenizer, self.ref.id,
                                chat_template_kwargs=self.ref.chat_template_kwargs, cache_reuse=cache_reuse)

    def _server(self):
        from localchat.backends.openai_http import backend_for
        from localchat.server.launch import free_port, start_ready

        if self.opts.base_url:
            backend = backend_for(self.opts.base_url, self.ref)
            _check_reachable(backend)
            return backend
        self.server = start_ready(self.ref, port=free_port(), on_poll=self.on_status, fit=self.opts.fit)
        return backend_for(self.server.base_url, self.ref)

    def close(self) -> None:
        for backend in self.opened.values():
            backend.close()
        if self.server is not None:
            self.server.stop()


def _check_reachable(backend) -> None:
    import httpx

    from localchat.backends.http import describe_http_error

    try:
        backend.client.get("models", timeout=5.0)
    except httpx.HTTPError as exc:
        raise LocalchatError(describe_http_error(exc, backend.url)) from None


def bench_scripts(opts: BenchOptions) -> list[BenchScript]:
    """--script files and --replay sessions; the built-in scripts when neither is given."""
    from localchat.store.saved_sessions import default_store

    replays = []
    for name in opts.replay:
        saved = default_store().load(name)
        replays.append(script_from_session(saved.name or name, saved.system, [t.user for t in saved.turns]))
    if opts.distance is not None:
        from localchat.bench.distance import distance_scripts, parse_distances

        distances = distance_scripts(parse_distances(opts.distance))
        return [*(load_script(script_path(p)) for p in opts.scripts), *distances, *replays]
    paths = opts.scripts or (() if replays else tuple(builtin_scripts(long=opts.policy is not None)))
    return [load_script(script_path(p)) for p in paths] + replays


@dataclass(frozen=True)
class PreparedBench:
    """A run whose inputs and outputs were all checked: the model, the plan, the arms."""

    opts: BenchOptions
    ref: ModelRef
    plan: BenchPlan
    arms: list[Arm]
    depths: tuple[int, ...] = ()  # --depth: the sweep instead of the scripts


def prepare_bench(opts: BenchOptions) -> PreparedBench:
    """Every check that can fail before the first turn: outputs, scripts, the model's name."""
    check_outputs(opts)
    if opts.policy is not None and (opts.history != "both" or opts.no_cache_reuse or opts.think or opts.think_budget):
        raise UsageError("--policy compares history policies: leave out --history, --no-cache-reuse, --think and "
                         "--think-budget")
    arms = arms_for(opts)
    scripts = bench_scripts(opts)
    if not scripts:
        raise UsageError("no bench scripts: pass --script FILE")
    ref = resolve(opts.model or DEFAULT_MODEL)
    check_tools(opts.tools, unattended=True)
    depths: tuple[int, ...] = ()
    if opts.depth is not None:
        from localchat.bench.depth import parse_depths
        from localchat.registry import context_length_of

        if opts.policy or opts.think or opts.think_budget or opts.tools.offered:
            raise UsageError("--depth measures one thing: leave out --policy, --think, --think-budget and tools")
        depths = parse_depths(opts.depth, context_length_of(ref) if ref.kind != "hub" else None)
    params = GenerationParams(temperature=opts.temperature, max_tokens=opts.max_tokens, seed=opts.seed)
    return PreparedBench(opts=opts, ref=ref, plan=BenchPlan(scripts, opts.repeat, opts.warmup, params, opts.seed),
                         arms=arms, depths=depths)


def run_bench(prepared: PreparedBench, *, on_start: Callable[[int], None] = lambda _: None,
              on_turn: Callable[[str], None] = lambda _: None,
              on_status: Callable[[str], None] = lambda _: None) -> BenchResult:
    """Every arm, one after the other; ``on_start`` hears the number of turns, ``on_turn`` each
    turn as it starts, ``on_status`` what a launched server is doing."""
    opts, ref, arms = prepared.opts, prepared.ref, prepared.arms
    tools = unattended_tools(opts.tools, on_notice=on_status)
    bench = replace(prepared.plan, tools=tools)
    scripts = bench.scripts
    per_arm = (bench.repeat + bench.warmup) * sum(len(t) for s in scripts for t in s.conversations)
    backends = ArmBackends(ref, opts, on_status, tools)
    on_start(len(prepared.depths) * opts.repeat * len({a.backend for a in arms}) if prepared.depths
             else per_arm * len(arms))
    at_start = conditions()

    def turn_started(arm: str, repeat: int, script: str, turn: int) -> None:
        label = "warm-up" if repeat < 0 else f"repeat {repeat + 1}/{bench.repeat}"
        on_turn(f"{arm} · {label} · {script} turn {turn}")

    depth_points: list = []
    try:
        turns: list[TurnRecord] = []
        if prepared.depths:
            depth_points = _depth_sweep(backends, arms, prepared, on_turn)
        else:
            for arm in arms:
                turns += run_arm(backends.for_arm(arm), arm, bench, turn_started)
        tokenizer = backends.tokenizer or _local_tokenizer(ref)
    finally:
        backends.close()
        if tools:
            tools.close()
    settings = asdict(opts) | {"arms": [a.label for a in arms], "scripts": [s.path for s in scripts]}
    settings = json.loads(json.dumps(settings, default=str))
    environment = environment_block(ref, tokenizer, opts) | {"conditions": {"start": at_start, "end": conditions()}}
    return BenchResult(environment, settings, turns, depth=depth_points)


def _depth_sweep(backends: ArmBackends, arms: list[Arm], prepared: PreparedBench,
                 on_turn: Callable[[str], None]) -> list:
    """The depth sweep on each backend the arms name (history on, KV reuse on)."""
    from localchat.bench.depth import measure

    points = []
    for name in dict.fromkeys(a.backend for a in arms):
        points += measure(backends.for_arm(Arm(name, True)), name, prepared.depths, prepared.opts.repeat,
                          prepared.plan.params, lambda b, d, r: on_turn(f"{b} · depth {d} · repeat {r + 1}"),
                          seed=prepared.opts.seed)
    return points


def _local_tokenizer(ref: ModelRef):
    try:
        from mlx_lm.utils import load_tokenizer

        return load_tokenizer(local_dir(ref))
    except Exception:  # only for the template hash; a remote-only model has none here
        return None
