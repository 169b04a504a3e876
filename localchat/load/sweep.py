"""``localchat load`` around the runs: options checked up front, the server (given or launched),
one run per (concurrency, history setting), and what a sweep adds: the knee and the batching gain."""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localchat.backends import DEFAULT_BASE_URL, DEFAULT_TIMEOUT_S, GenerationParams
from localchat.bench.output_paths import check_outputs
from localchat.bench.script import SCRIPTS_DIR, load_script, script_path
from localchat.conversation.settings import DEFAULT_TRIM_TO, TrimPolicy
from localchat.environment import collect
from localchat.errors import LocalchatError, UsageError
from localchat.fit.check import FitSettings
from localchat.load.metrics import Slo, summarize
from localchat.load.run import LoadPlan, Run, RunResult
from localchat.registry import DEFAULT_MODEL, ModelRef, local_tokenizer_loader, resolve
from localchat.toolbox import check_tools, unattended_tools
from localchat.tools.settings import ToolSettings

if TYPE_CHECKING:
    from localchat.serve.front.running import RunningGateway
    from localchat.server.launch import RunningServer

SCHEMA = "localchat.load/2"  # 2: runs carry their repeat; "repeated" holds the intervals
DEFAULT_SCRIPT = SCRIPTS_DIR / "recall-en.yaml"
WARMUP_SEED = 104_729  # added to the run's seed for the warm-up's draws
REPEAT_SEED = 7_919  # added once more for each pass of --repeat


@dataclass(frozen=True)
class LoadOptions:
    base_url: str = DEFAULT_BASE_URL
    model: str | None = None
    api_key: str | None = None
    users: tuple[int, ...] = (1,)  # one run each: --users N, or --sweep 1,2,4,8
    script: Path | None = None
    turns: int | None = None
    think_time_s: float = 0.0
    history: str = "both"  # on | off | both
    duration_s: float | None = None
    conversations: int = 2  # per user
    warmup: int = 1  # unmeasured conversations first (one user): a fresh server's first requests are slow
    repeat: int = 1  # passes of the whole sweep, new draws each (intervals across them)
    temperature: float = 0.0
    max_tokens: int = 64
    seed: int | None = None  # sent only when given: a seeded request is not batched by mlx_lm.server
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    out: Path | None = None
    plot: Path | None = None
    launch: bool = False
    server_args: tuple[str, ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_context_tokens: int | None = None
    trim_to: float = DEFAULT_TRIM_TO
    compact: bool = False  # --compact auto: needs --max-context-tokens and the model's local tokenizer
    tools: ToolSettings = field(default_factory=ToolSettings)  # --tools, --mcp: shared by every user
    api: str | None = None  # "anthropic": the users speak the Messages API (to a gateway) instead of chat completions
    memory_limit: int | None = None  # --launch: the model is checked against it before the server loads it
    force: bool = False


@dataclass
class LoadResult:
    environment: dict
    settings: dict
    runs: list[RunResult] = field(default_factory=list)

    stopped: bool = False  # Ctrl+C or SIGTERM, perhaps before the first run (during the warm-up)

    @property
    def partial(self) -> bool:
        return self.stopped or any(run.partial for run in self.runs)

    def summaries(self) -> list[dict]:
        slo = Slo(self.settings["slo_ttft_s"], self.settings["slo_tpot_s"])
        return [{"users": run.users, "history": "on" if run.history else "off", "repeat": run.repeat,
                 "partial": run.partial, **summarize(run.records, run.gaps, run.wall_s, slo)} for run in self.runs]

    def repeated(self) -> list[dict] | None:
        """With ``--repeat``: each (users, history)'s figures across the passes, the median with its
        95 % interval (each pass one value, resampled); None with one pass."""
        from localchat.intervals import bootstrap

        summaries = [s for s in self.summaries() if not s["partial"]]
        if len({s["repeat"] for s in summaries}) < 2:
            return None
        groups: dict[tuple, list[dict]] = {}
        for s in summaries:
            groups.setdefault((s["users"], s["history"]), []).append(s)
        figures = {"output_tps": lambda s: s["output_tps"], "request_rate": lambda s: s["request_rate"],
                   "ttft_p50_s": lambda s: s["ttft_s"]["p50"], "ttft_p99_s": lambda s: s["ttft_s"]["p99"],
                   "accuracy": lambda s: s["accuracy"]["rate"]}
        return [{"users": users, "history": history, "passes": len(runs),
                 **{name: bootstrap([[v] for r in runs if (v := pick(r)) is not None]).as_dict()
                    for name, pick in figures.items()}}
                for (users, history), runs in groups.items()]

    def sweep(self) -> dict:
        """Per history setting: the knee (fewest users whose TTFT p99 exceeds the SLO) and the
        batching gain (aggregate output tokens/s at N users ÷ at 1 user)."""
        by_history: dict[str, list[dict]] = {}
        for s in self.summaries():
            by_history.setdefault(s["history"], []).append(s)
        slo = self.settings["slo_ttft_s"]
        figures = {}
        for history, runs in by_history.items():
            runs = _medians_by_users(runs)
            single = next((r["output_tps"] for r in runs if r["users"] == 1), None)
            over = [r["users"] for r in runs if slo is not None and (r["ttft_s"]["p99"] or 0) > slo]
            figures[history] = {
                "knee_users": min(over) if over else None,
                "batching_gain": {str(r["users"]): r["output_tps"] / single if single and r["output_tps"] else None
                                  for r in runs},
            }
        return figures

    def as_dict(self) -> dict:
        return {"schema": SCHEMA, "partial": self.partial, "environment": self.environment,
                "settings": self.settings, "runs": self.summaries(), "sweep": self.sweep(),
                "repeated": self.repeated()}


def _medians_by_users(runs: list[dict]) -> list[dict]:
    """One entry a number of users: its output tok/s and TTFT p99, the median over the passes."""
    import statistics

    by_users: dict[int, list[dict]] = {}
    for r in runs:
        by_users.setdefault(r["users"], []).append(r)

    def median(values: list) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    return [{"users": users, "output_tps": median([r["output_tps"] for r in group]),
             "ttft_s": {"p99": median([r["ttft_s"]["p99"] for r in group])}} for users, group in by_users.items()]


def parse_sweep(text: str) -> tuple[int, ...]:
    try:
        users = tuple(int(part) for part in text.split(","))
    except (ValueError, OverflowError):
        raise UsageError(f"--sweep takes whole numbers separated by commas, e.g. 1,2,4,8 (got {text!r})") from None
    if not users or any(n < 1 or n > 256 for n in users) or len(set(users)) != len(users):
        raise UsageError(f"--sweep {text}: each number of users must be from 1 to 256, once")
    return tuple(sorted(users))


def check_options(opts: LoadOptions) -> None:
    """Everything that can be refused before a server is started or contacted."""
    if opts.duration_s is not None and not opts.duration_s > 0:
        raise UsageError("--duration must be a number of seconds > 0")
    if opts.think_time_s < 0:
        raise UsageError("--think-time must be ≥ 0 seconds")
    if opts.launch and opts.base_url != DEFAULT_BASE_URL:
        raise UsageError("--launch starts its own server: leave out --base-url")
    if opts.server_args and not opts.launch:
        raise UsageError(f"server arguments after -- ({' '.join(opts.server_args)}) need --launch")
    if opts.compact and opts.max_context_tokens is None:
        raise UsageError("--compact auto needs a budget here: add --max-context-tokens N")
    for name in ("slo_ttft_s", "slo_tpot_s"):
        value = getattr(opts, name)
        if value is not None and not value > 0:
            raise UsageError(f"--{name.removesuffix('_s').replace('_', '-')} must be a number of seconds > 0")
    check_tools(opts.tools, unattended=True)
    check_outputs(opts)  # --out and --plot, as bench checks them


def make_plan(opts: LoadOptions) -> LoadPlan:
    script = load_script(script_path(opts.script) if opts.script else DEFAULT_SCRIPT)
    params = GenerationParams(temperature=opts.temperature, max_tokens=opts.max_tokens, seed=opts.seed)
    return LoadPlan(script=script, conversations=opts.conversations, turns=opts.turns,
                    think_time_s=opts.think_time_s, duration_s=opts.duration_s, params=params,
                    seed=opts.seed or 0, slo=Slo(opts.slo_ttft_s, opts.slo_tpot_s),
                    trim=TrimPolicy(max_context_tokens=opts.max_context_tokens, trim_to=opts.trim_to),
                    compact=opts.compact)


def environment_block(opts: LoadOptions, ref: ModelRef | None, base_url: str) -> dict:
    env = collect()
    return env.as_dict() | {
        "hardware": env.hardware_label, "model": ref.id if ref else (opts.model or "the server's model"),
        "server": base_url, "launched": opts.launch, "server_args": list(opts.server_args),
        "seed_sent": opts.seed is not None,
        "batching": ("requests carry a seed: mlx_lm.server serves them one at a time" if opts.seed is not None
                     else "no seed sent: mlx_lm.server may batch the users' requests"),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def known_model(name: str | None, launch: bool) -> ModelRef | None:
    if launch:
        return resolve(name or DEFAULT_MODEL)
    try:
        return resolve(name) if name else None
    except UsageError:
        return None  # a name only the server knows (vLLM's served model name, say)


class Target:
    """The server under load: the one given, or one launched (and stopped) here."""

    def __init__(self, opts: LoadOptions, on_status: Callable[[str], None]):
        self.opts, self.on_status = opts, on_status
        self.ref = known_model(opts.model, opts.launch)
        loader = local_tokenizer_loader(self.ref)
        if opts.max_context_tokens is not None and loader is None:
            raise UsageError("--max-context-tokens counts tokens with the model's tokenizer: pass -m with a model "
                             "that is on this machine")
        self.load_tokenizer = functools.cache(loader) if loader else None  # one load for every user
        self.server: RunningServer | None = None
        self.gateway: RunningGateway | None = (
            None  # --launch --api anthropic: the gateway in front of the launched server
        )
        self.base_url = opts.base_url
        self.tools = unattended_tools(opts.tools, on_notice=on_status)

    def __enter__(self) -> Target:
        if self.opts.launch:
            from localchat.server.launch import free_port, start_ready

            fit = FitSettings(memory_limit=self.opts.memory_limit, force=self.opts.force,
                              context=self.opts.max_context_tokens)
            if self.ref is None:
                raise UsageError("--launch starts a server for a model: add -m MODEL")
            self.server = start_ready(self.ref, port=free_port(), extra=self.opts.server_args, on_poll=self.on_status,
                                      fit=fit)
            self.base_url = self.server.base_url
            if self.opts.api is not None:
                self._launch_gateway()
        self._check_reachable()
        return self

    def _launch_gateway(self) -> None:
        from localchat.serve.front.running import serve_gateway
        from localchat.serve.pool.entries import upstream_pool
        from localchat.serve.pool.upstream import reach_upstream
        from localchat.server.launch import free_port

        upstream = reach_upstream(self.base_url, self.ref, timeout_s=self.opts.timeout_s)
        self.gateway = serve_gateway(upstream_pool(upstream), "127.0.0.1", free_port(), (self.opts.api or "",), None,
                                     log=lambda _: None, on_poll=self.on_status, model=upstream.model_field)
        self.base_url = self.gateway.url + "/v1"

    def __exit__(self, *exc: Any) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        if self.server is not None:
            self.server.stop()
        if self.tools is not None:
            self.tools.close()

    def backend(self):
        from localchat.backends.anthropic_http import AnthropicBackend
        from localchat.backends.openai_http import backend_for

        backend = backend_for(self.base_url, self.ref, name=self.opts.model, api_key=self.opts.api_key,
                              load_tokenizer=self.load_tokenizer, timeout_s=self.opts.timeout_s,
                              kind=AnthropicBackend if self.opts.api == "anthropic" else None)
        if self.tools is not None:
            backend.offer_tools(self.tools.specs)
        return backend

    def _check_reachable(self) -> None:
        import httpx

        from localchat.backends.http import describe_http_error

        backend = self.backend()
        try:
            backend.client.get("models", timeout=5.0)
        except httpx.HTTPError as exc:
            raise LocalchatError(describe_http_error(exc, backend.url)) from None
        finally:
            backend.close()


def history_settings(opts: LoadOptions) -> list[bool]:
    return [True, False] if opts.history == "both" else [opts.history == "on"]


def run_load(opts: LoadOptions, result: LoadResult, target: Target, plan: LoadPlan,
             on_run: Callable[[Run], None] = lambda _: None) -> LoadResult:
    """Warm-up conversations (discarded), then every run of the sweep, in order, into ``result``
    (so an interrupted sweep keeps what it measured); ``on_run`` hears each run as it starts."""
    plan = replace(plan, tools=target.tools)
    if opts.warmup:  # its own draws, so that it warms the server but not its prompt cache for the runs
        warmup = replace(plan, conversations=opts.warmup, duration_s=None, seed=plan.seed + WARMUP_SEED)
        Run(warmup, 1, True, target.backend).execute()
    for repeat in range(opts.repeat):  # each pass draws new codes, as bench's repeats do
        drawn = replace(plan, seed=plan.seed + repeat * REPEAT_SEED)
        for users in opts.users:
            for history in history_settings(opts):
                run = Run(drawn, users, history, target.backend, repeat=repeat)
                on_run(run)
                result.runs.append(run.result)
                run.execute()
    return result


def new_result(opts: LoadOptions, target: Target) -> LoadResult:
    settings = json.loads(json.dumps(asdict(opts) | {"api_key": "[set]" if opts.api_key else None}, default=str))
    return LoadResult(environment_block(opts, target.ref, target.base_url), settings)
