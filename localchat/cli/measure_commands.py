"""``localchat bench`` and ``localchat load``'s options: what history costs, alone and under load."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from localchat.backends import DEFAULT_BASE_URL, DEFAULT_TIMEOUT_S
from localchat.cli.dispatch import err_console, out_console, run, user_errors
from localchat.cli.options import (
    ApiKeyOpt,
    BaseUrlOpt,
    BenchBackend,
    BenchModelOpt,
    Compact,
    CompactOpt,
    ForceOpt,
    LoadModelOpt,
    MemoryLimitOpt,
    OnOffBoth,
    OutputFormat,
    TimeoutOpt,
    TrimToOpt,
    check_base_url,
    check_seconds,
    check_seed,
    check_temperature,
    check_wait,
    converted,
)
from localchat.cli.serve_options import LoadApiOpt
from localchat.cli.tool_options import (
    McpOnlyOpt,
    McpOpt,
    ToolsOpt,
    ToolTimeoutOpt,
    UnattendedApproveOpt,
    tool_settings,
)
from localchat.conversation.settings import DEFAULT_TRIM_TO

SERVER_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True}  # mlx_lm.server's, after --


def bench(
    model: BenchModelOpt = None,
    backend: Annotated[BenchBackend, typer.Option(help="Which backend(s) to run.")] = BenchBackend.inproc,
    history: Annotated[OnOffBoth, typer.Option(help="History on, off, or both (side by side).")] = OnOffBoth.both,
    script: Annotated[
        Optional[list[Path]],
        typer.Option(
            "--script",
            help="A bench script (YAML), or a built-in one's name (name-recall); repeatable [default: the built-in "
                 "scripts].",
        ),
    ] = None,
    repeat: Annotated[int, typer.Option(min=1, help="Measured repeats (each draws new codes).")] = 1,
    warmup: Annotated[int, typer.Option(min=0, help="Unmeasured repeats first.")] = 0,
    temperature: Annotated[
        float, typer.Option(callback=check_temperature, help="Fixed for the whole run, and recorded.")
    ] = 0.0,
    seed: Annotated[int, typer.Option(callback=check_seed, help="Seeds the scripts' draws and sampling.")] = 0,
    max_tokens: Annotated[int, typer.Option(min=1, help="Longest reply, in tokens.")] = 64,
    no_cache_reuse: Annotated[
        bool, typer.Option("--no-cache-reuse", help="Add an in-process history-on arm without KV reuse.")
    ] = False,
    base_url: Annotated[
        Optional[str],
        typer.Option(
            envvar="LOCALCHAT_BASE_URL",
            callback=check_base_url,
            help="Use this server for the server arm [default: launch one].",
        ),
    ] = None,
    out: Annotated[Optional[Path], typer.Option(help="Write results.json, turns.csv and summary.md here.")] = None,
    format: Annotated[OutputFormat, typer.Option("--format", help="What to print.")] = OutputFormat.table,
    plot: Annotated[
        Optional[Path], typer.Option(help="Write a PNG of TTFT and prompt tokens per turn (needs --extra plot).")
    ] = None,
    replay: Annotated[
        Optional[list[str]],
        typer.Option("--replay", help="Replay a saved session's user turns as a script; repeatable."),
    ] = None,
    think: Annotated[
        Optional[OnOffBoth],
        typer.Option(help="Thinking on, off, or both (side by side: what reasoning costs) [default: the model's own]."),
    ] = None,
    think_budget: Annotated[
        Optional[str],
        typer.Option(metavar="N,N,…", help="Thinking budgets side by side (one arm each; none: no budget), "
                                           "e.g. 0,16,64,none: what a budget costs in answers and saves in time."),
    ] = None,
    policy: Annotated[
        Optional[str],
        typer.Option(help="History policies side by side on long scripts: full,window:N,budget:N,compact:N,pin:N."),
    ] = None,
    tools: ToolsOpt = None,
    mcp: McpOpt = None,
    mcp_only: McpOnlyOpt = None,
    approve_tools: UnattendedApproveOpt = False,
    tool_timeout: ToolTimeoutOpt = None,
    distance: Annotated[
        Optional[str],
        typer.Option(
            metavar="K,K,…",
            help="Recall by distance: a code told, K small-talk turns, the code asked for, for each K (0,2,4,8), "
                 "through every arm (--policy arms too).",
        ),
    ] = None,
    depth: Annotated[
        Optional[str],
        typer.Option(
            metavar="D,D,…",
            help="Instead of the scripts: a turn's TTFT, prefill and decode speed with D tokens of conversation "
                 "already in the context, uncached and cached (0,256,512,768).",
        ),
    ] = None,
    memory_limit: MemoryLimitOpt = None,
    force: ForceOpt = False,
) -> None:
    """History on vs off at a fixed temperature: what history costs (tokens, TTFT) and buys (answers).
    Compare two runs: localchat bench compare A B."""
    tool_choice = tool_settings(files=tools, mcp=mcp, mcp_only=mcp_only, approve=approve_tools, timeout_s=tool_timeout)
    opts = dict(model=model, backend=backend.value, history=history.value, scripts=tuple(script or ()),
                        repeat=repeat, warmup=warmup, temperature=temperature, seed=seed, max_tokens=max_tokens,
                        no_cache_reuse=no_cache_reuse, base_url=base_url, out=out, format=format.value,
                        plot=plot, replay=tuple(replay or ()), think=think.value if think else None, policy=policy,
                        think_budget=think_budget,
                        tools=tool_choice, depth=depth, distance=distance, memory_limit=memory_limit, force=force)
    from localchat.cli.bench import run_bench_cmd

    run(run_bench_cmd, options=opts, console=out_console(), err=err_console())


def load(
    ctx: typer.Context,
    base_url: BaseUrlOpt = DEFAULT_BASE_URL,
    model: LoadModelOpt = None,
    api_key: ApiKeyOpt = None,
    users: Annotated[int, typer.Option(min=1, max=256, help="Concurrent simulated users.")] = 1,
    sweep: Annotated[Optional[str], typer.Option(help="Several runs, e.g. 1,2,4,8 users (instead of --users).")] = None,
    script: Annotated[
        Optional[Path],
        typer.Option(help="A bench script the users play, or a built-in one's name [default: recall-en]."),
    ] = None,
    turns: Annotated[
        Optional[int],
        typer.Option(min=1, help="Turns a conversation (cut short, or padded before the last, scored turn)."),
    ] = None,
    think_time: Annotated[float, typer.Option(callback=check_wait, help="Seconds a user waits between turns.")] = 0.0,
    history: Annotated[OnOffBoth, typer.Option(help="History on, off, or both (a run each).")] = OnOffBoth.both,
    duration: Annotated[
        Optional[float],
        typer.Option(callback=check_seconds, help="No request starts after this many seconds of a run."),
    ] = None,
    conversations: Annotated[int, typer.Option(min=1, help="Conversations each user plays in a run.")] = 2,
    warmup: Annotated[
        int, typer.Option(min=0, help="Unmeasured conversations first (a fresh server's first requests are slow).")
    ] = 1,
    repeat: Annotated[
        int,
        typer.Option(
            min=1,
            max=50,
            help="Run the whole sweep this many times (new draws each time): each figure then has a 95 % interval.",
        ),
    ] = 1,
    temperature: Annotated[float, typer.Option(callback=check_temperature, help="Fixed for the whole run.")] = 0.0,
    max_tokens: Annotated[int, typer.Option(min=1, help="Longest reply, in tokens.")] = 64,
    seed: Annotated[
        Optional[int],
        typer.Option(
            callback=check_seed,
            help="Send this seed (mlx_lm.server then serves requests one at a time) [default: none sent].",
        ),
    ] = None,
    slo_ttft: Annotated[
        Optional[float], typer.Option(callback=check_seconds, help="TTFT objective in seconds (goodput, knee).")
    ] = None,
    slo_tpot: Annotated[
        Optional[float],
        typer.Option(callback=check_seconds, help="Time-per-output-token objective in seconds (goodput)."),
    ] = None,
    out: Annotated[Optional[Path], typer.Option(help="Write results.json, requests.csv and summary.md here.")] = None,
    plot: Annotated[
        Optional[Path], typer.Option(help="Write a PNG of throughput and TTFT against users (needs --extra plot).")
    ] = None,
    launch: Annotated[
        bool, typer.Option("--launch", help="Start mlx_lm.server here (server args after --), stop it at the end.")
    ] = False,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT_S,
    max_context_tokens: Annotated[
        Optional[int], typer.Option(min=1, help="Each user's history budget, in tokens.")
    ] = None,
    trim_to: TrimToOpt = DEFAULT_TRIM_TO,
    compact: CompactOpt = Compact.off,
    tools: ToolsOpt = None,
    mcp: McpOpt = None,
    mcp_only: McpOnlyOpt = None,
    approve_tools: UnattendedApproveOpt = False,
    tool_timeout: ToolTimeoutOpt = None,
    api: LoadApiOpt = None,
    memory_limit: MemoryLimitOpt = None,
    force: ForceOpt = False,
) -> None:
    """Many simulated users with multi-turn history against an OpenAI-compatible server (or, with
    --api anthropic, a gateway's Messages API)."""
    tool_choice = tool_settings(files=tools, mcp=mcp, mcp_only=mcp_only, approve=approve_tools, timeout_s=tool_timeout)
    from localchat.load.sweep import LoadOptions, parse_sweep

    with user_errors():
        counts = parse_sweep(sweep) if sweep is not None else (users,)
    opts = LoadOptions(base_url=base_url, model=model, api_key=api_key, users=counts, script=script, turns=turns,
                       think_time_s=think_time, history=history.value, duration_s=duration,
                       conversations=conversations, warmup=warmup, repeat=repeat, temperature=temperature,
                       max_tokens=max_tokens, seed=seed,
                       slo_ttft_s=slo_ttft, slo_tpot_s=slo_tpot, out=out, plot=plot, launch=launch,
                       server_args=tuple(ctx.args), timeout_s=timeout, max_context_tokens=max_context_tokens,
                       trim_to=trim_to, compact=compact is Compact.auto, tools=tool_choice,
                       api=api, memory_limit=converted(memory_limit), force=force)
    from localchat.cli.load import run_load_cmd

    run(run_load_cmd, opts=opts, console=out_console(), err=err_console())
