"""``localchat serve`` and ``localchat ps``: their options, collected and handed to ``serve.daemon``
and ``cli.ps``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from localchat.backends import DEFAULT_BASE_URL
from localchat.cli.dispatch import err_console, out_console, run
from localchat.cli.options import (
    AllowDownloadOpt,
    ApiKeyOpt,
    BaseUrlOpt,
    ForceOpt,
    MemoryLimitOpt,
    converted,
)
from localchat.cli.serve_options import (
    AllowImageUrlsOpt,
    AllowOriginOpt,
    ApiOpt,
    DistributedBackend,
    DistributedBackendOpt,
    GatewayKeyOpt,
    HostfileOpt,
    KeepAliveOpt,
    KvBitsOpt,
    KvGroupSizeOpt,
    PinOpt,
    PromptCacheDirOpt,
    PromptCacheDiskOpt,
    QuantizedKvStartOpt,
    RanksOpt,
    ServeModelsOpt,
    UpstreamOpt,
    ranks_of,
)
from localchat.cli.think_options import ThinkBudgetMessageOpt, ThinkBudgetOpt, budget_tokens
from localchat.cli.tool_options import ApproveToolsOpt, McpOpt, ToolsOpt, tool_settings


def serve(
    ctx: typer.Context,
    model: ServeModelsOpt = None,
    every: Annotated[
        bool, typer.Option("--all", help="Serve every model `localchat models` shows as present.")
    ] = False,
    host: Annotated[
        str, typer.Option(metavar="HOST", help="Interface to bind (loopback unless you mean it).")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=1, max=65535, envvar="LOCALCHAT_PORT", metavar="PORT", help="Port to listen on.")
    ] = 8080,
    log: Annotated[
        Optional[Path],
        typer.Option(
            help="The first model's engine log [default: logs/server-PORT.log in "
            "the localchat data directory; the others beside it]."
        ),
    ] = None,
    smoke: Annotated[
        bool, typer.Option("--smoke", help="Start, run the smoke test, stop; exit with its result.")
    ] = False,
    keep_alive: KeepAliveOpt = "5m",
    pin: PinOpt = None,
    upstream: UpstreamOpt = None,
    ranks: RanksOpt = None,
    hostfile: HostfileOpt = None,
    distributed_backend: DistributedBackendOpt = DistributedBackend.ring,
    pipeline: Annotated[
        bool, typer.Option("--pipeline", help="Split the layers across the ranks instead of the heads.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the command that would run, and start nothing.")
    ] = False,
    api: ApiOpt = None,
    api_key: GatewayKeyOpt = None,
    allow_origin: AllowOriginOpt = None,
    memory_limit: MemoryLimitOpt = None,
    force: ForceOpt = False,
    allow_download: AllowDownloadOpt = False,
    plain: Annotated[
        bool,
        typer.Option(
            "--plain",
            help="Run mlx_lm.server as it is: response_format and tool_choice are then not enforced (for comparison).",
        ),
    ] = False,
    prompt_cache_disk: PromptCacheDiskOpt = "10GB",
    prompt_cache_dir: PromptCacheDirOpt = None,
    open_page: Annotated[bool, typer.Option("--open", help="Open the chat page in the default browser.")] = False,
    results: Annotated[
        Optional[Path],
        typer.Option(
            metavar="DIR",
            show_default=False,
            exists=True,
            file_okay=False,
            help="A bench or load --out directory whose plots the page shows.",
        ),
    ] = None,
    tools: ToolsOpt = None,
    mcp: McpOpt = None,
    approve_tools: ApproveToolsOpt = False,
    allow_image_urls: AllowImageUrlsOpt = None,
    kv_bits: KvBitsOpt = None,
    kv_group_size: KvGroupSizeOpt = None,
    quantized_kv_start: QuantizedKvStartOpt = None,
    think_budget: ThinkBudgetOpt = None,
    think_budget_message: ThinkBudgetMessageOpt = "",
) -> None:
    """Serve models on one port by name (-m repeatable): the first loaded now, the others when first
    asked for, each within the memory budget and unloaded when idle; response_format and tool_choice
    enforced while decoding (extra mlx_lm.server args after --); with --api, the Anthropic Messages
    and OpenAI Responses APIs too; one model on several ranks with --ranks N or --hostfile FILE."""
    from localchat.cli.pull import fetch_missing
    from localchat.cli.smoke import smoke_served
    from localchat.serve.daemon import ServeRequest, run_serve
    from localchat.serve.kv_options import parse_kv_choice

    asked = ServeRequest(
        models=tuple(model or ()),
        host=host,
        port=port,
        log=log,
        extra=tuple(ctx.args),
        apis=converted(api) or (),
        api_key=api_key,
        origins=converted(allow_origin),
        keep_alive=keep_alive,
        image_urls=converted(allow_image_urls),
        pins=tuple(pin or ()),
        upstreams=tuple(upstream or ()),
        memory_limit=converted(memory_limit),
        force=force,
        plain=plain,
        prompt_cache_dir=prompt_cache_dir,
        prompt_cache_disk=converted(prompt_cache_disk),
        open_page=open_page,
        results=results,
        tools=tool_settings(files=tools, mcp=mcp, mcp_only=None, approve=approve_tools, timeout_s=None),
        kv=parse_kv_choice(kv_bits or [], kv_group_size, quantized_kv_start),
        think_budget=budget_tokens(think_budget),
        think_budget_message=think_budget_message,
    )
    console, err = out_console(), err_console()
    run(run_serve, asked=asked, console=console, err=err, every=every, dry_run=dry_run,
        ranks=ranks_of(ranks, hostfile, distributed_backend, pipeline),
        smoke=(lambda url, ref: smoke_served(url, ref, asked.apis, asked.api_key, console)) if smoke else None,
        fetch=(lambda ref, fit: fetch_missing(ref, fit, err)) if allow_download else None)


def ps(
    base_url: BaseUrlOpt = DEFAULT_BASE_URL,
    port: Annotated[
        Optional[int],
        typer.Option(
            min=1,
            max=65535,
            metavar="PORT",
            show_default=False,
            help="The port of a serve on this machine (instead of --base-url).",
        ),
    ] = None,
    api_key: ApiKeyOpt = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print a list of objects (model, memory_bytes, expires_in_s, in_flight, pid, …)."),
    ] = False,
) -> None:
    """The models a running `localchat serve` holds: memory (estimated and resident), since when,
    expires in, requests in flight, the engine's pid."""
    where = f"http://127.0.0.1:{port}/v1" if port is not None else base_url
    from localchat.cli.ps import run_ps

    run(run_ps, base_url=where, api_key=api_key, as_json=as_json, console=out_console())
