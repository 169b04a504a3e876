"""The command line: each command collects its options and calls one function.

Errors are mapped here and only here: a ``LocalchatError`` becomes one red line on stderr and its
exit code (2 for usage errors, like Typer's own); Ctrl+C exits 130 without a traceback. The codes
themselves are in ``outcomes``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from localchat.backends import DEFAULT_BASE_URL, DEFAULT_TIMEOUT_S
from localchat.cli import outcomes
from localchat.cli.options import (
    ApiKeyOpt,
    Backend,
    BaseUrlOpt,
    BenchBackend,
    ChatOptions,
    Compact,
    CompactAtOpt,
    CompactKeepOpt,
    CompactOpt,
    ContextOptions,
    ExportFormat,
    GenerationOptions,
    ModelOpt,
    ModelOptions,
    OnOffBoth,
    OutputFormat,
    OutputOptions,
    StorageOptions,
    ThinkOpt,
    TimeoutOpt,
    TrimToOpt,
    check_base_url,
    check_fraction,
    check_seconds,
    check_seed,
    check_temperature,
    check_wait,
)
from localchat.conversation.compaction import DEFAULT_KEEP, DEFAULT_TRIGGER
from localchat.conversation.turn import DEFAULT_TRIM_TO, TrimPolicy
from localchat.errors import LocalchatError, TerminationRequested


def _click_class(name: str) -> type:
    """Click's own exception classes, as the installed Typer has them (it may vendor click)."""
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == name)


ClickUsageError, ClickException = _click_class("UsageError"), _click_class("ClickException")


class OneLineErrors(TyperGroup):
    """Usage errors as one line (``error: … (see: localchat chat --help)``), exit 2, instead of
    click's usage block; every other outcome as click and Typer decide it."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except ClickUsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # `localchat` alone: the help, as click shows it
                exc.show()
                sys.exit(exc.exit_code)
            command = exc.ctx.command_path if exc.ctx else "localchat"
            err_console.print(f"[red]error:[/red] {escape(exc.format_message())} (see: {command} --help)")
            sys.exit(outcomes.USAGE)
        except typer.Abort:
            sys.exit(outcomes.INTERRUPTED)
        except ClickException as exc:
            err_console.print(f"[red]error:[/red] {escape(exc.format_message())}")
            sys.exit(exc.exit_code)
        if code == outcomes.INTERRUPTED:  # Typer's own mapping of a Ctrl+C it caught, silently
            err_console.print("[yellow]interrupted[/yellow]")
        sys.exit(code if isinstance(code, int) else outcomes.OK)

    def invoke(self, ctx):
        """Ctrl+C between Typer and a command's ``run`` is the same one line as inside it."""
        with user_errors():
            return super().invoke(ctx)


app = typer.Typer(
    name="localchat", cls=OneLineErrors, no_args_is_help=True, add_completion=False, rich_markup_mode=None,
    help="Multi-turn chat with local MLX models: one history builder, honest per-turn figures.",
)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def out_console() -> Console:
    """stdout; long lines wrap in the terminal, never in the text (ids and commands stay whole)."""
    return Console(highlight=False, soft_wrap=True)


@contextmanager
def user_errors() -> Iterator[None]:
    try:
        yield
    except LocalchatError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(exc.exit_code) from None
    except TerminationRequested:
        err_console.print("[yellow]terminated (SIGTERM)[/yellow]")
        raise SystemExit(outcomes.TERMINATED) from None  # past click, which maps a 130 of its own
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/yellow]")
        raise SystemExit(outcomes.INTERRUPTED) from None


def run(target: str, **kwargs: Any) -> None:
    """Import ``module:function`` and call it by keyword, both inside the error mapping (so even
    Ctrl+C during an import is one line and 130), then exit with the code it returns."""
    with user_errors():
        module, name = target.split(":")
        code = getattr(importlib.import_module(module), name)(**kwargs)
    raise typer.Exit(outcomes.OK if code is None else code)


@app.command()
def chat(
    prompt: Annotated[Optional[str], typer.Argument(
        help="Answer this one prompt and exit ('-' reads stdin); without it, start the REPL.")] = None,
    model: ModelOpt = None,
    backend: Annotated[Backend, typer.Option(help="inproc: mlx_lm in this process; server: an OpenAI-compatible server.")] = Backend.inproc,
    base_url: BaseUrlOpt = DEFAULT_BASE_URL,
    api_key: ApiKeyOpt = None,
    system: Annotated[Optional[str], typer.Option(
        "--system", "-s", help='System message ("" for none; default: the model\'s from models.yaml).')] = None,
    temperature: Annotated[Optional[float], typer.Option(callback=check_temperature, help="Sampling temperature (default 0.0: greedy).")] = None,
    top_p: Annotated[Optional[float], typer.Option(callback=check_fraction, help="Nucleus sampling, in (0, 1] (default: the model's, else 1.0).")] = None,
    max_tokens: Annotated[Optional[int], typer.Option(min=1, help="Longest reply, in tokens.")] = None,
    seed: Annotated[Optional[int], typer.Option(callback=check_seed, help="Random seed for sampling (set before each turn).")] = None,
    think: ThinkOpt = None,
    show_thinking: Annotated[bool, typer.Option("--show-thinking", help="Stream a thinking model's reasoning (dim, on stderr) instead of a one-line counter.")] = False,
    no_history: Annotated[bool, typer.Option("--no-history", help="REPL only: send each question alone.")] = False,
    max_turns: Annotated[Optional[int], typer.Option(min=0, help="Keep at most N past turns (oldest dropped first).")] = None,
    max_context_tokens: Annotated[Optional[int], typer.Option(min=1, help="Drop oldest turns until the request fits N tokens.")] = None,
    max_input_chars: Annotated[int, typer.Option(min=1, help="Longest accepted input, in characters.")] = 8000,
    trim_to: TrimToOpt = DEFAULT_TRIM_TO,
    compact: CompactOpt = Compact.off,
    compact_at: CompactAtOpt = DEFAULT_TRIGGER,
    compact_keep: CompactKeepOpt = DEFAULT_KEEP,
    compact_model: Annotated[Optional[str], typer.Option(help="Summarize with this model instead [default: the chat's].")] = None,
    pin: Annotated[Optional[list[str]], typer.Option(help="A fact kept after the system message, never trimmed; repeatable.")] = None,
    stats: Annotated[bool, typer.Option("--stats/--no-stats", help="Show the figures line after each reply.")] = True,
    no_cache_reuse: Annotated[bool, typer.Option("--no-cache-reuse", help="Re-prefill the whole prompt every turn (for benchmarks).")] = False,
    allow_download: Annotated[bool, typer.Option("--allow-download", help="Let a missing Hugging Face model download.")] = False,
    json_answer: Annotated[bool, typer.Option("--json", help='Answers must be JSON {"answer": string}; invalid ones are not kept.')] = False,
    json_schema: Annotated[Optional[Path], typer.Option(help="Answers must be JSON valid against this JSON Schema file.")] = None,
    record: Annotated[Optional[Path], typer.Option(help="Write each turn's request (before the call) and response as JSON files here [config: records_dir].")] = None,
    resume: Annotated[Optional[str], typer.Option(help="Continue a conversation saved with /save NAME.")] = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT_S,
) -> None:
    """Chat with a model: one PROMPT, or the REPL."""
    opts = ChatOptions(
        model=ModelOptions(model=model, backend=backend.value, base_url=base_url, api_key=api_key, timeout_s=timeout,
                           allow_download=allow_download, cache_reuse=not no_cache_reuse),
        generation=GenerationOptions(system=system, temperature=temperature, top_p=top_p,
                                     max_tokens=max_tokens, seed=seed, think=think),
        history=not no_history,
        trim=TrimPolicy(max_turns=max_turns, max_context_tokens=max_context_tokens,
                        max_input_chars=max_input_chars, trim_to=trim_to),
        context=ContextOptions(compact=compact is Compact.auto, compact_at=compact_at, compact_keep=compact_keep,
                               compact_model=compact_model, pins=tuple(pin or ())),
        output=OutputOptions(stats=stats, json_answer=json_answer, json_schema=json_schema,
                             show_thinking=show_thinking),
        storage=StorageOptions(record=record, resume=resume),
    )

    run("localchat.cli.chat:run_chat", opts=opts, prompt=prompt, err=err_console)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def serve(
    ctx: typer.Context,
    model: ModelOpt = None,
    host: Annotated[str, typer.Option(help="Interface to bind (loopback unless you mean it).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, envvar="LOCALCHAT_PORT")] = 8080,
    log: Annotated[Optional[Path], typer.Option(help="mlx_lm.server's log file [default: logs/server-PORT.log in the localchat data directory].")] = None,
    smoke: Annotated[bool, typer.Option("--smoke", help="Start, run the smoke test, stop; exit with its result.")] = False,
) -> None:
    """Launch mlx_lm.server (extra server args after --), ready when a completion succeeds."""
    run("localchat.cli.serve:run_serve", model=model, host=host, port=port, log=log, smoke=smoke,
        extra=tuple(ctx.args), console=out_console())


@app.command("smoke")
def smoke_cmd(
    base_url: BaseUrlOpt = DEFAULT_BASE_URL,
    model: ModelOpt = None,
    api_key: ApiKeyOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a machine-readable result.")] = False,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT_S,
) -> None:
    """Check a running server: health, models, completions, streaming usage, recall, prompt cache."""
    run("localchat.cli.serve:run_smoke_cmd", base_url=base_url, model=model, api_key=api_key, timeout_s=timeout,
        as_json=as_json, console=out_console())


@app.command()
def parity(
    model: ModelOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a machine-readable result.")] = False,
) -> None:
    """The same 3-turn greedy conversation in-process and through a launched server: identical?"""
    run("localchat.cli.serve:run_parity_cmd", model=model, as_json=as_json, console=out_console())


@app.command()
def bench(
    model: ModelOpt = None,
    backend: Annotated[BenchBackend, typer.Option(help="Which backend(s) to run.")] = BenchBackend.inproc,
    history: Annotated[OnOffBoth, typer.Option(help="History on, off, or both (side by side).")] = OnOffBoth.both,
    script: Annotated[Optional[list[Path]], typer.Option("--script", help="A bench script (YAML), or a built-in one's name (name-recall); repeatable [default: the built-in scripts].")] = None,
    repeat: Annotated[int, typer.Option(min=1, help="Measured repeats (each draws new codes).")] = 1,
    warmup: Annotated[int, typer.Option(min=0, help="Unmeasured repeats first.")] = 0,
    temperature: Annotated[float, typer.Option(callback=check_temperature, help="Fixed for the whole run, and recorded.")] = 0.0,
    seed: Annotated[int, typer.Option(callback=check_seed, help="Seeds the scripts' draws and sampling.")] = 0,
    max_tokens: Annotated[int, typer.Option(min=1, help="Longest reply, in tokens.")] = 64,
    no_cache_reuse: Annotated[bool, typer.Option("--no-cache-reuse", help="Add an in-process history-on arm without KV reuse.")] = False,
    base_url: Annotated[Optional[str], typer.Option(envvar="LOCALCHAT_BASE_URL", callback=check_base_url, help="Use this server for the server arm [default: launch one].")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Write results.json, turns.csv and summary.md here.")] = None,
    format: Annotated[OutputFormat, typer.Option("--format", help="What to print.")] = OutputFormat.table,
    plot: Annotated[Optional[Path], typer.Option(help="Write a PNG of TTFT and prompt tokens per turn (needs --extra plot).")] = None,
    replay: Annotated[Optional[list[str]], typer.Option("--replay", help="Replay a saved session's user turns as a script; repeatable.")] = None,
    think: Annotated[Optional[OnOffBoth], typer.Option(help="Thinking on, off, or both (side by side: what reasoning costs) [default: the model's own].")] = None,
    policy: Annotated[Optional[str], typer.Option(help="History policies side by side on long scripts: full,window:N,budget:N,compact:N,pin:N.")] = None,
) -> None:
    """History on vs off at a fixed temperature: what history costs (tokens, TTFT) and buys (answers)."""
    opts = dict(model=model, backend=backend.value, history=history.value, scripts=tuple(script or ()),
                        repeat=repeat, warmup=warmup, temperature=temperature, seed=seed, max_tokens=max_tokens,
                        no_cache_reuse=no_cache_reuse, base_url=base_url, out=out, format=format.value,
                        plot=plot, replay=tuple(replay or ()), think=think.value if think else None, policy=policy)
    run("localchat.cli.bench:run_bench_cmd", options=opts, console=out_console(), err=err_console)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def load(
    ctx: typer.Context,
    base_url: BaseUrlOpt = DEFAULT_BASE_URL,
    model: ModelOpt = None,
    api_key: ApiKeyOpt = None,
    users: Annotated[int, typer.Option(min=1, max=256, help="Concurrent simulated users.")] = 1,
    sweep: Annotated[Optional[str], typer.Option(help="Several runs, e.g. 1,2,4,8 users (instead of --users).")] = None,
    script: Annotated[Optional[Path], typer.Option(help="A bench script the users play, or a built-in one's name [default: recall-en].")] = None,
    turns: Annotated[Optional[int], typer.Option(min=1, help="Turns a conversation (cut short, or padded before the last, scored turn).")] = None,
    think_time: Annotated[float, typer.Option(callback=check_wait, help="Seconds a user waits between turns.")] = 0.0,
    history: Annotated[OnOffBoth, typer.Option(help="History on, off, or both (a run each).")] = OnOffBoth.both,
    duration: Annotated[Optional[float], typer.Option(callback=check_seconds, help="No request starts after this many seconds of a run.")] = None,
    conversations: Annotated[int, typer.Option(min=1, help="Conversations each user plays in a run.")] = 2,
    warmup: Annotated[int, typer.Option(min=0, help="Unmeasured conversations first (a fresh server's first requests are slow).")] = 1,
    temperature: Annotated[float, typer.Option(callback=check_temperature, help="Fixed for the whole run.")] = 0.0,
    max_tokens: Annotated[int, typer.Option(min=1, help="Longest reply, in tokens.")] = 64,
    seed: Annotated[Optional[int], typer.Option(callback=check_seed, help="Send this seed (mlx_lm.server then serves requests one at a time) [default: none sent].")] = None,
    slo_ttft: Annotated[Optional[float], typer.Option(callback=check_seconds, help="TTFT objective in seconds (goodput, knee).")] = None,
    slo_tpot: Annotated[Optional[float], typer.Option(callback=check_seconds, help="Time-per-output-token objective in seconds (goodput).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Write results.json, requests.csv and summary.md here.")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="Write a PNG of throughput and TTFT against users (needs --extra plot).")] = None,
    launch: Annotated[bool, typer.Option("--launch", help="Start mlx_lm.server here (server args after --), stop it at the end.")] = False,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT_S,
    max_context_tokens: Annotated[Optional[int], typer.Option(min=1, help="Each user's history budget, in tokens.")] = None,
    trim_to: TrimToOpt = DEFAULT_TRIM_TO,
    compact: CompactOpt = Compact.off,
) -> None:
    """Many simulated users with multi-turn history against an OpenAI-compatible server."""
    from localchat.load.sweep import LoadOptions, parse_sweep

    with user_errors():
        counts = parse_sweep(sweep) if sweep is not None else (users,)
    opts = LoadOptions(base_url=base_url, model=model, api_key=api_key, users=counts, script=script, turns=turns,
                       think_time_s=think_time, history=history.value, duration_s=duration,
                       conversations=conversations, warmup=warmup, temperature=temperature, max_tokens=max_tokens, seed=seed,
                       slo_ttft_s=slo_ttft, slo_tpot_s=slo_tpot, out=out, plot=plot, launch=launch,
                       server_args=tuple(ctx.args), timeout_s=timeout, max_context_tokens=max_context_tokens,
                       trim_to=trim_to, compact=compact is Compact.auto)
    run("localchat.cli.load:run_load_cmd", opts=opts, console=out_console(), err=err_console)


sessions_app = typer.Typer(help="Saved conversations (/save NAME in the REPL, chat --resume NAME).",
                           no_args_is_help=True, rich_markup_mode=None)
app.add_typer(sessions_app, name="sessions")


@sessions_app.command("list")
def sessions_list() -> None:
    """Saved sessions, newest first."""
    run("localchat.cli.sessions:show_list", console=out_console())


@sessions_app.command("show")
def sessions_show(name: str) -> None:
    """The saved messages of NAME, with each turn's figures."""
    run("localchat.cli.sessions:show_session", console=out_console(), name=name)


@sessions_app.command("rm")
def sessions_rm(name: str) -> None:
    """Delete the saved session NAME."""
    run("localchat.cli.sessions:remove_session", console=err_console, name=name)


@sessions_app.command("export")
def sessions_export(
    name: str,
    format: Annotated[ExportFormat, typer.Option("--format", help="Markdown or JSON, on stdout.")] = ExportFormat.md,
) -> None:
    """Print NAME as Markdown or JSON."""
    run("localchat.cli.sessions:export_session", name=name, fmt=format.value)


@app.command("import")
def import_cmd(
    file: Annotated[Optional[Path], typer.Argument(help="A GGUF file (llama.cpp, LM Studio, a download).",
                                                   show_default=False)] = None,
    name: Annotated[Optional[str], typer.Option(help="The name for -m [default: from the file name].")] = None,
    from_ollama: Annotated[Optional[str], typer.Option(help="Import ollama's MODEL[:TAG] from ~/.ollama (read-only).")] = None,
) -> None:
    """Turn a GGUF file into an MLX model without loss; then -m NAME works everywhere."""
    run("localchat.cli.importing:run_import", file=file, name=name, from_ollama=from_ollama, console=out_console(),
        err=err_console)


@app.command()
def models() -> None:
    """List models.yaml entries: present locally?, size on disk, quantization bits."""
    run("localchat.cli.doctor:show_models", console=out_console())


@app.command()
def doctor(base_url: BaseUrlOpt = DEFAULT_BASE_URL) -> None:
    """Python, OS, chip, MLX device and versions, HF cache, models present, server port."""
    run("localchat.cli.doctor:run_doctor", console=out_console(), base_url=base_url)
