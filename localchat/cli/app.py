"""The command line: the Typer app and its commands, each collecting its options and calling one
function through ``dispatch.run`` (where errors and outcomes become exit codes)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from localchat.backends import DEFAULT_BASE_URL, DEFAULT_TIMEOUT_S
from localchat.cli.chat_command import chat
from localchat.cli.dispatch import OneLineErrors, err_console, out_console, run
from localchat.cli.measure_commands import SERVER_ARGS, bench, load
from localchat.cli.options import (
    ApiKeyOpt,
    BaseUrlOpt,
    DistributedBackend,
    DistributedBackendOpt,
    ExportFormat,
    HostfileOpt,
    LaunchedModelOpt,
    RanksOpt,
    ServedModelOpt,
    TimeoutOpt,
    ranks_of,
)

app = typer.Typer(
    name="localchat", cls=OneLineErrors, no_args_is_help=True, add_completion=False, rich_markup_mode=None,
    help="Multi-turn chat with local MLX models: one history builder, honest per-turn figures.",
)
app.command()(chat)
app.command()(bench)
app.command(context_settings=SERVER_ARGS)(load)


@app.command(context_settings=SERVER_ARGS)
def serve(
    ctx: typer.Context,
    model: LaunchedModelOpt = None,
    host: Annotated[str, typer.Option(metavar="HOST", help="Interface to bind (loopback unless you mean it).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, envvar="LOCALCHAT_PORT", metavar="PORT",
                                      help="Port to listen on.")] = 8080,
    log: Annotated[Optional[Path], typer.Option(help="mlx_lm.server's log file [default: logs/server-PORT.log in the localchat data directory].")] = None,
    smoke: Annotated[bool, typer.Option("--smoke", help="Start, run the smoke test, stop; exit with its result.")] = False,
    ranks: RanksOpt = None,
    hostfile: HostfileOpt = None,
    distributed_backend: DistributedBackendOpt = DistributedBackend.ring,
    pipeline: Annotated[bool, typer.Option("--pipeline", help="Split the layers across the ranks instead of the heads.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the command that would run, and start nothing.")] = False,
) -> None:
    """Launch mlx_lm.server (extra server args after --), ready when a completion succeeds; on
    several ranks with --ranks N (this machine) or --hostfile FILE (mlx.launch's)."""
    run("localchat.cli.serve:run_serve", model=model, host=host, port=port, log=log, smoke=smoke,
        extra=tuple(ctx.args), console=out_console(), dry_run=dry_run,
        ranks=ranks_of(ranks, hostfile, distributed_backend, pipeline))


@app.command("smoke")
def smoke_cmd(
    base_url: BaseUrlOpt = DEFAULT_BASE_URL,
    model: ServedModelOpt = None,
    api_key: ApiKeyOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a machine-readable result.")] = False,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT_S,
) -> None:
    """Check a running server: health, models, completions, streaming usage, recall, prompt cache."""
    run("localchat.cli.serve:run_smoke_cmd", base_url=base_url, model=model, api_key=api_key, timeout_s=timeout,
        as_json=as_json, console=out_console())


@app.command()
def parity(
    model: LaunchedModelOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a machine-readable result.")] = False,
    ranks: RanksOpt = None,
    hostfile: HostfileOpt = None,
    distributed_backend: DistributedBackendOpt = DistributedBackend.ring,
    pipeline: Annotated[bool, typer.Option("--pipeline", help="The server splits layers, not heads, across ranks.")] = False,
) -> None:
    """The same 3-turn greedy conversation in-process and through a launched server (on several
    ranks with --ranks N): identical?"""
    run("localchat.cli.serve:run_parity_cmd", model=model, as_json=as_json, console=out_console(),
        ranks=ranks_of(ranks, hostfile, distributed_backend, pipeline))


sessions_app = typer.Typer(help="Saved conversations (/save NAME in the REPL, chat --resume NAME).", cls=OneLineErrors,
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
    """Delete the saved session NAME and its KV cache."""
    run("localchat.cli.sessions:remove_session", console=err_console(), name=name)


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
        err=err_console())


@app.command()
def models() -> None:
    """List models.yaml entries: present locally?, size on disk, quantization bits."""
    run("localchat.cli.doctor:show_models", console=out_console())


@app.command()
def doctor(base_url: BaseUrlOpt = DEFAULT_BASE_URL) -> None:
    """Python, OS, chip, MLX device and versions, HF cache, models present, server port."""
    run("localchat.cli.doctor:run_doctor", console=out_console(), base_url=base_url)
