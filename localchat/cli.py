"""The command line: each command collects its options and calls one function.

Errors are mapped here and only here: a ``LocalchatError`` becomes one red line on stderr and its
exit code (2 for usage errors, like Typer's own); Ctrl+C exits 130 without a traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from localchat.errors import LocalchatError

app = typer.Typer(
    name="localchat", no_args_is_help=True, add_completion=False, rich_markup_mode=None,
    help="Multi-turn chat with local MLX models: one history builder, honest per-turn figures.",
)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


@contextmanager
def user_errors() -> Iterator[None]:
    try:
        yield
    except LocalchatError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/yellow]")
        raise typer.Exit(130) from None


def _top_p(value: float) -> float:
    if not 0.0 < value <= 1.0:
        raise typer.BadParameter("must be in (0, 1]")
    return value


DEFAULT_BASE_URL = "http://127.0.0.1:8080/v1"  # the same default as backends.openai_http (kept import-free)
ModelOpt = Annotated[str, typer.Option("--model", "-m", envvar="LOCALCHAT_MODEL",
                                        help="models.yaml id or alias, a local MLX model directory, or a Hugging Face repo id.")]
BaseUrlOpt = Annotated[str, typer.Option(envvar="LOCALCHAT_BASE_URL", help="OpenAI-compatible base URL.")]
ApiKeyOpt = Annotated[Optional[str], typer.Option(envvar="LOCALCHAT_API_KEY", show_default=False,
                                                  help="Bearer token for remote servers (never printed or recorded).")]


class Backend(str, Enum):
    inproc = "inproc"
    server = "server"



@app.command()
def chat(
    prompt: Annotated[Optional[str], typer.Argument(
        help="Answer this one prompt and exit ('-' reads stdin); without it, start the REPL.")] = None,
    model: Annotated[Optional[str], typer.Option(
        "--model", "-m", envvar="LOCALCHAT_MODEL",
        help="models.yaml id or alias, a local MLX model directory, or a Hugging Face repo id "
             "[default: demo in-process; the server's own model with --backend server].")] = None,
    backend: Annotated[Backend, typer.Option(help="inproc: mlx_lm in this process; server: an OpenAI-compatible server.")] = Backend.inproc,
    base_url: BaseUrlOpt = DEFAULT_BASE_URL,
    api_key: ApiKeyOpt = None,
    system: Annotated[Optional[str], typer.Option(
        "--system", "-s", help='System message ("" for none; default: the model\'s from models.yaml).')] = None,
    temperature: Annotated[Optional[float], typer.Option(min=0.0, help="Sampling temperature (default 0.0: greedy).")] = None,
    top_p: Annotated[float, typer.Option(callback=_top_p, help="Nucleus sampling, in (0, 1].")] = 1.0,
    max_tokens: Annotated[Optional[int], typer.Option(min=1, help="Longest reply, in tokens.")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Random seed for sampling (set before each turn).")] = None,
    no_history: Annotated[bool, typer.Option("--no-history", help="REPL only: send each question alone.")] = False,
    max_turns: Annotated[Optional[int], typer.Option(min=0, help="Keep at most N past turns (oldest dropped first).")] = None,
    max_context_tokens: Annotated[Optional[int], typer.Option(min=1, help="Drop oldest turns until the request fits N tokens.")] = None,
    max_input_chars: Annotated[int, typer.Option(min=1, help="Longest accepted input, in characters.")] = 8000,
    stats: Annotated[bool, typer.Option("--stats/--no-stats", help="Show the figures line after each reply.")] = True,
    no_cache_reuse: Annotated[bool, typer.Option("--no-cache-reuse", help="Re-prefill the whole prompt every turn (for benchmarks).")] = False,
    allow_download: Annotated[bool, typer.Option("--allow-download", help="Let a missing Hugging Face model download.")] = False,
    json_answer: Annotated[bool, typer.Option("--json", help='Answers must be JSON {"answer": string}; invalid ones are not kept.')] = False,
    json_schema: Annotated[Optional[Path], typer.Option(help="Answers must be JSON valid against this JSON Schema file.")] = None,
    record: Annotated[Optional[Path], typer.Option(help="Write each turn's request (before the call) and response as JSON files here [config: records_dir].")] = None,
    resume: Annotated[Optional[str], typer.Option(help="Continue a conversation saved with /save NAME.")] = None,
) -> None:
    """Chat with a model: one PROMPT, or the REPL."""
    from localchat.chat import ChatOptions, run_chat
    from localchat.render import ChatUI

    opts = ChatOptions(model, system, temperature, top_p, max_tokens, seed, no_history, max_turns,
                       max_context_tokens, max_input_chars, stats, not no_cache_reuse, allow_download,
                       backend.value, base_url, api_key, json_answer, json_schema, record, resume)
    with user_errors():
        ui = ChatUI(err=err_console, show_stats=stats, json_mode=json_answer or json_schema is not None)
        code = run_chat(opts, prompt, ui)
    raise typer.Exit(code)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def serve(
    ctx: typer.Context,
    model: Annotated[Optional[str], typer.Option("--model", "-m", envvar="LOCALCHAT_MODEL",
                                                  help="Model to serve [default: demo].")] = None,
    host: Annotated[str, typer.Option(help="Interface to bind (loopback unless you mean it).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, envvar="LOCALCHAT_PORT")] = 8080,
    log: Annotated[Optional[Path], typer.Option(help="mlx_lm.server's log file [default: a temp file].")] = None,
    smoke: Annotated[bool, typer.Option("--smoke", help="Start, run the smoke test, stop; exit with its result.")] = False,
) -> None:
    """Launch mlx_lm.server (extra server args after --), ready when a completion succeeds."""
    from localchat.serving import run_serve

    with user_errors():
        code = run_serve(model, host, port, log, smoke, tuple(ctx.args), Console(highlight=False))
    raise typer.Exit(code)


@app.command("smoke")
def smoke_cmd(
    base_url: BaseUrlOpt = DEFAULT_BASE_URL,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Model the server should use (the demo model is judged on recall).")] = None,
    api_key: ApiKeyOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a machine-readable result.")] = False,
) -> None:
    """Check a running server: health, models, completions, streaming usage, recall, prompt cache."""
    from localchat.serving import run_smoke_cmd

    with user_errors():
        code = run_smoke_cmd(base_url, model, api_key, as_json, Console(highlight=False))
    raise typer.Exit(code)


@app.command()
def parity(
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Model to compare [default: demo].")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a machine-readable result.")] = False,
) -> None:
    """The same 3-turn greedy conversation in-process and through a launched server: identical?"""
    from localchat.serving import run_parity, show_parity

    console = Console(highlight=False)
    with user_errors():
        report = run_parity(model, console)
        show_parity(console, report, as_json)
    raise typer.Exit(0 if report.ok else 1)


class BenchBackend(str, Enum):
    inproc = "inproc"
    server = "server"
    both = "both"


class HistoryArms(str, Enum):
    on = "on"
    off = "off"
    both = "both"


class OutputFormat(str, Enum):
    table = "table"
    md = "md"
    json = "json"
    csv = "csv"


@app.command()
def bench(
    model: Annotated[Optional[str], typer.Option("--model", "-m", envvar="LOCALCHAT_MODEL", help="Model [default: demo].")] = None,
    backend: Annotated[BenchBackend, typer.Option(help="Which backend(s) to run.")] = BenchBackend.inproc,
    history: Annotated[HistoryArms, typer.Option(help="History on, off, or both (side by side).")] = HistoryArms.both,
    script: Annotated[Optional[list[Path]], typer.Option("--script", help="A bench script (YAML); repeatable [default: scripts/bench/*.yaml].")] = None,
    repeat: Annotated[int, typer.Option(min=1, help="Measured repeats (each draws new codes).")] = 1,
    warmup: Annotated[int, typer.Option(min=0, help="Unmeasured repeats first.")] = 0,
    temperature: Annotated[float, typer.Option(min=0.0, help="Fixed for the whole run, and recorded.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seeds the scripts' draws and sampling.")] = 0,
    max_tokens: Annotated[int, typer.Option(min=1, help="Longest reply, in tokens.")] = 64,
    no_cache_reuse: Annotated[bool, typer.Option("--no-cache-reuse", help="Add an in-process history-on arm without KV reuse.")] = False,
    base_url: Annotated[Optional[str], typer.Option(envvar="LOCALCHAT_BASE_URL", help="Use this server for the server arm [default: launch one].")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Write results.json, turns.csv and summary.md here.")] = None,
    format: Annotated[OutputFormat, typer.Option("--format", help="What to print.")] = OutputFormat.table,
    plot: Annotated[Optional[Path], typer.Option(help="Write a PNG of TTFT and prompt tokens per turn (needs --extra plot).")] = None,
    replay: Annotated[Optional[list[str]], typer.Option("--replay", help="Replay a saved session's user turns as a script; repeatable.")] = None,
) -> None:
    """History on vs off at a fixed temperature: what history costs (tokens, TTFT) and buys (answers)."""
    from localchat.benchreport import BenchOptions, run_bench_cmd

    opts = BenchOptions(model, backend.value, history.value, tuple(script or ()), repeat, warmup, temperature,
                        seed, max_tokens, no_cache_reuse, base_url, out, format.value, plot, tuple(replay or ()))
    with user_errors():
        code = run_bench_cmd(opts, Console(highlight=False), err_console)
    raise typer.Exit(code)


sessions_app = typer.Typer(help="Saved conversations (/save NAME in the REPL, chat --resume NAME).",
                           no_args_is_help=True, rich_markup_mode=None)
app.add_typer(sessions_app, name="sessions")


class ExportFormat(str, Enum):
    md = "md"
    json = "json"


@sessions_app.command("list")
def sessions_list() -> None:
    """Saved sessions, newest first."""
    from localchat.sessionscli import show_list

    with user_errors():
        show_list(Console())


@sessions_app.command("show")
def sessions_show(name: str) -> None:
    """The saved messages of NAME, with each turn's figures."""
    from localchat.sessionscli import show_session

    with user_errors():
        show_session(Console(highlight=False), name)


@sessions_app.command("rm")
def sessions_rm(name: str) -> None:
    """Delete the saved session NAME."""
    from localchat.sessionscli import remove_session

    with user_errors():
        remove_session(err_console, name)


@sessions_app.command("export")
def sessions_export(
    name: str,
    format: Annotated[ExportFormat, typer.Option("--format", help="Markdown or JSON, on stdout.")] = ExportFormat.md,
) -> None:
    """Print NAME as Markdown or JSON."""
    from localchat.sessionscli import export_session

    with user_errors():
        export_session(name, format.value)


@app.command()
def models() -> None:
    """List models.yaml entries: present locally?, size on disk, quantization bits."""
    from localchat.doctor import show_models

    with user_errors():
        show_models(Console())


@app.command()
def doctor(base_url: BaseUrlOpt = DEFAULT_BASE_URL) -> None:
    """Python, OS, chip, MLX device and versions, HF cache, models present, server port."""
    from localchat.doctor import run_doctor

    with user_errors():
        run_doctor(Console(), base_url)


def main() -> None:
    app()
