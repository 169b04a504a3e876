"""The command line: the Typer app and its commands, each collecting its options and calling one
function through ``dispatch.run`` (where errors and outcomes become exit codes)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from localchat.backends import DEFAULT_BASE_URL, DEFAULT_TIMEOUT_S
from localchat.cli.chat_command import chat
from localchat.cli.dispatch import (
    DefaultRun,
    OneLineErrors,
    RunsByDefault,
    err_console,
    out_console,
    run,
)
from localchat.cli.kept_commands import log_app, sessions_app
from localchat.cli.measure_commands import SERVER_ARGS, bench, load
from localchat.cli.options import (
    ApiKeyOpt,
    BaseUrlOpt,
    LaunchedModelOpt,
    MemoryLimitOpt,
    ServedModelOpt,
    TimeoutOpt,
    check_base_url,
)
from localchat.cli.serve_command import ps, serve
from localchat.cli.serve_options import (
    AllowImageUrlsOpt,
    AllowOriginOpt,
    DistributedBackend,
    DistributedBackendOpt,
    GatewayApiOpt,
    GatewayKeyOpt,
    HostfileOpt,
    RanksOpt,
    SmokeApiOpt,
    ranks_of,
)

app = typer.Typer(
    name="localchat", cls=OneLineErrors, no_args_is_help=True, add_completion=False, rich_markup_mode=None,
    help="Multi-turn chat with local MLX models: one history builder, honest per-turn figures.",
)


def _show_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        def of(name: str) -> str:
            try:
                return version(name)
            except PackageNotFoundError:
                return "not installed"

        typer.echo(f"localchat {of('localchat')} (mlx {of('mlx')}, mlx-lm {of('mlx-lm')})")
        raise typer.Exit()


@app.callback()
def main_options(version: Annotated[bool, typer.Option("--version", callback=_show_version, is_eager=True,
                                                       help="Print localchat's version (and MLX's) and exit.")] = False
                 ) -> None:
    """Multi-turn chat with local MLX models: one history builder, honest per-turn figures."""


app.command()(chat)
bench_app = typer.Typer(help="Benchmark what history costs and buys: run (the default), compare two runs.",
                        cls=RunsByDefault, rich_markup_mode=None)
app.add_typer(bench_app, name="bench")
bench_app.command("run", cls=DefaultRun)(bench)


@bench_app.command("compare")
def bench_compare(
    first: Annotated[Path, typer.Argument(metavar="A", help="A bench results.json (or the --out directory).")],
    second: Annotated[Path, typer.Argument(metavar="B", help="Another, compared with A.")],
    force: Annotated[bool, typer.Option("--force", help="Compare runs whose scripts or temperature differ.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print a machine-readable result.")] = False,
) -> None:
    """Two runs side by side: each figure with its 95 % interval, B against A tested (paired when
    both drew the same conversations)."""
    from localchat.cli.bench import run_compare

    run(run_compare, first=first, second=second, force=force, as_json=as_json,
        console=out_console())
app.command(context_settings=SERVER_ARGS)(load)


app.command(context_settings=SERVER_ARGS)(serve)
app.command()(ps)


@app.command()
def gateway(
    upstream: Annotated[
        str,
        typer.Option(
            callback=check_base_url,
            metavar="URL",
            help="The OpenAI-compatible server to put the gateway in front of, e.g. http://127.0.0.1:8080/v1.",
        ),
    ],
    model: ServedModelOpt = None,
    host: Annotated[
        str, typer.Option(metavar="HOST", help="Interface to bind (loopback unless you mean it).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, metavar="PORT", help="Port to listen on.")] = 8081,
    api: GatewayApiOpt = "anthropic,responses",
    api_key: GatewayKeyOpt = None,
    upstream_api_key: ApiKeyOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT_S,
    allow_origin: AllowOriginOpt = None,
    allow_image_urls: AllowImageUrlsOpt = None,
) -> None:
    """The Anthropic Messages and OpenAI Responses APIs in front of a running server (chat
    completions, models and health passed through)."""
    from localchat.cli.gateway import run_gateway

    run(run_gateway, upstream_url=upstream, model=model, host=host, port=port,
        console=out_console(), err=err_console(), apis=api, api_key=api_key, upstream_key=upstream_api_key,
        timeout_s=timeout, origins=allow_origin, image_urls=allow_image_urls)


@app.command("smoke")
def smoke_cmd(
    base_url: BaseUrlOpt = DEFAULT_BASE_URL,
    model: ServedModelOpt = None,
    api_key: ApiKeyOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a machine-readable result.")] = False,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT_S,
    api: SmokeApiOpt = None,
) -> None:
    """Check a running server: health, models, completions, streaming usage, recall, prompt cache
    (with --api, through a gateway's Anthropic or Responses API, and a tool call round trip)."""
    from localchat.cli.smoke import run_smoke_cmd

    run(run_smoke_cmd, base_url=base_url, model=model, api_key=api_key, timeout_s=timeout,
        as_json=as_json, console=out_console(), api=api)


@app.command()
def parity(
    model: LaunchedModelOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a machine-readable result.")] = False,
    ranks: RanksOpt = None,
    hostfile: HostfileOpt = None,
    distributed_backend: DistributedBackendOpt = DistributedBackend.ring,
    pipeline: Annotated[
        bool, typer.Option("--pipeline", help="The server splits layers, not heads, across ranks.")
    ] = False,
) -> None:
    """The same 3-turn greedy conversation in-process and through a launched server (on several
    ranks with --ranks N): identical?"""
    from localchat.cli.smoke import run_parity_cmd

    run(run_parity_cmd, model=model, as_json=as_json, console=out_console(),
        ranks=ranks_of(ranks, hostfile, distributed_backend, pipeline))


app.add_typer(sessions_app, name="sessions")
app.add_typer(log_app, name="log")


@app.command("import")
def import_cmd(
    file: Annotated[
        Optional[Path], typer.Argument(help="A GGUF file (llama.cpp, LM Studio, a download).", show_default=False)
    ] = None,
    name: Annotated[Optional[str], typer.Option(help="The name for -m [default: from the file name].")] = None,
    from_ollama: Annotated[
        Optional[str], typer.Option(help="Import ollama's MODEL[:TAG] from ~/.ollama (read-only).")
    ] = None,
) -> None:
    """Turn a GGUF file into an MLX model without loss; then -m NAME works everywhere."""
    from localchat.cli.importing import run_import

    run(run_import, file=file, name=name, from_ollama=from_ollama, console=out_console(),
        err=err_console())


@app.command()
def pull(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="A models.yaml id or alias (NAME@8bit for a variant it "
                                         "lists) or a Hugging Face repo id.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the plan and the verdict; fetch nothing.")] = False,
    memory_limit: MemoryLimitOpt = None,
    max_context_tokens: Annotated[Optional[int], typer.Option(min=1, help="The context you will use, for the memory "
                                                              "check [default: 8192].")] = None,
    kv_bits: Annotated[Optional[int], typer.Option(min=2, max=8, help="The KV cache bits you will use.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Download a model that does not fit, or that the free disk "
                                        "cannot hold.")] = False,
) -> None:
    """Fetch a model into the Hugging Face cache: its files, size, the free disk and whether it fits
    this machine first, then the download with progress (Ctrl+C keeps what finished)."""
    from localchat.cli.pull import run_pull

    run(run_pull, model=model, dry_run=dry_run, memory_limit=memory_limit,
        context=max_context_tokens, kv_bits=kv_bits, force=force, err=err_console())


@app.command("rm")
def remove_model(
    model: Annotated[
        str, typer.Argument(metavar="MODEL", help="A models.yaml id, an imported model or a Hugging Face repo id.")
    ],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask first.")] = False,
) -> None:
    """Remove a model pull fetched or import made, freeing its disk (asks first)."""
    from localchat.cli.remove import run_rm

    run(run_rm, model=model, yes=yes, console=err_console())


@app.command()
def models() -> None:
    """List models.yaml entries: present locally?, size on disk, quantization bits, and whether each fits."""
    from localchat.cli.doctor import show_models

    run(show_models, console=out_console())


@app.command()
def doctor(base_url: BaseUrlOpt = DEFAULT_BASE_URL) -> None:
    """Python, OS, chip, MLX device and versions, HF cache, models present, server port."""
    from localchat.cli.doctor import run_doctor

    run(run_doctor, console=out_console(), base_url=base_url)


mcp_app = typer.Typer(help="MCP servers checked by hand, before a model sees them: list their tools, call one.",
                      cls=OneLineErrors, rich_markup_mode=None, no_args_is_help=True)
app.add_typer(mcp_app, name="mcp")
McpFilesOpt = Annotated[list[Path], typer.Option("--mcp", metavar="FILE", help="The servers' configuration "
                                                 "(mcpServers or VS Code's servers, as chat --mcp reads it).")]


@mcp_app.command("list")
def mcp_list(
    mcp: McpFilesOpt,
    only: Annotated[Optional[str], typer.Option("--mcp-only", metavar="NAME,…", help="Only these servers.")] = None,
    timeout: Annotated[float, typer.Option("--mcp-timeout", min=0.1, metavar="SECONDS",
                                           help="Give a server this long to start.")] = 20.0,
) -> None:
    """Start the servers and list each one's state and the tools the model would be offered."""
    names = tuple(n.strip() for n in only.split(",") if n.strip()) if only else ()
    from localchat.cli.mcp_commands import list_servers

    run(list_servers, files=mcp, only=names, timeout_s=timeout, console=out_console(),
        err=err_console())


@mcp_app.command("call")
def mcp_call(
    server: Annotated[str, typer.Argument(metavar="SERVER", help="A server of the --mcp file.")],
    tool: Annotated[str, typer.Argument(metavar="TOOL", help="The tool, by the server's own name (add).")],
    mcp: McpFilesOpt,
    arguments: Annotated[str, typer.Argument(metavar="ARGUMENTS",
                                             help="A JSON object: '{\"a\": 1, \"b\": 2}'.")] = "{}",
    timeout: Annotated[float, typer.Option("--tool-timeout", min=0.1, metavar="SECONDS",
                                           help="Give the call this long.")] = 30.0,
) -> None:
    """Call one tool with ARGUMENTS, checked against its schema as a model's call is; its result on stdout."""
    from localchat.cli.mcp_commands import call_tool

    run(call_tool, files=mcp, server=server, tool=tool, arguments=arguments,
        timeout_s=timeout, console=out_console(), err=err_console())
