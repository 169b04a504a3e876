"""The options of serve, gateway and smoke: the APIs, the gateway's key, the ranks."""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from localchat.cli.options import MODEL_KINDS, key_option


def check_apis(value: str | None) -> tuple[str, ...] | None:
    from localchat.errors import UsageError
    from localchat.serve.apis.names import parse_apis

    try:
        return parse_apis(value)
    except UsageError as exc:
        raise typer.BadParameter(str(exc)) from None


ApiOpt = Annotated[Optional[str], typer.Option(callback=check_apis, metavar="API[,API]", show_default=False,
                                               help="Serve these APIs too, through a gateway: anthropic, responses.")]
GatewayApiOpt = Annotated[str, typer.Option("--api", callback=check_apis, metavar="API[,API]",
                                            help="The APIs to serve: anthropic, responses (comma-separated).")]
SmokeApiOpt = Annotated[Optional[str], typer.Option("--api", callback=check_apis, metavar="API[,API]",
                                                    show_default=False, help="Check these APIs of a gateway "
                                                    "(anthropic, responses) instead of chat completions.")]


def one_api(value: Enum | None) -> str | None:
    return value.value if value is not None else None


class MessagesApi(str, Enum):
    anthropic = "anthropic"


LoadApiOpt = Annotated[Optional[MessagesApi], typer.Option("--api", callback=one_api, show_default=False,
                                                           help="Drive a gateway's Anthropic Messages API (with "
                                                                "--launch, one is started in front of the server).")]
GatewayKeyOpt = Annotated[Optional[str], key_option(
    "LOCALCHAT_GATEWAY_KEY", "The key clients must send (x-api-key or Bearer) [default: none: loopback use].")]


def check_origins(value: str | None) -> tuple[str, ...]:
    """``--allow-origin http://localhost:3000,https://app.example`` (or ``*``): exact origins."""
    origins = tuple(o.strip().rstrip("/") for o in (value or "").split(",") if o.strip())
    wrong = [o for o in origins if o != "*" and not o.startswith(("http://", "https://", "app://", "file://"))]
    if wrong:
        raise typer.BadParameter(f"{wrong[0]!r} is not an origin such as http://localhost:3000 (or * for any)")
    return origins


def check_image_urls(value: str | None) -> tuple[str, ...]:
    """``--allow-image-urls https://example.com/img/``: prefixes of http(s) URLs, each with its host."""
    prefixes = tuple(p.strip() for p in (value or "").split(",") if p.strip())
    wrong = [p for p in prefixes if not re.fullmatch(r"https?://[^/\s]+/\S*", p)]
    if wrong:
        raise typer.BadParameter(f"{wrong[0]!r} is not the start of a URL such as https://example.com/img/ "
                                 "(a scheme, a host and a slash)")
    return prefixes


AllowImageUrlsOpt = Annotated[Optional[str], typer.Option(
    "--allow-image-urls", callback=check_image_urls, metavar="PREFIX[,PREFIX]", show_default=False,
    help="URLs a picture may name (e.g. https://example.com/img/); any other must come as its data [default: "
         "data: URLs only: no fetching, no local files].")]

AllowOriginOpt = Annotated[Optional[str], typer.Option(
    "--allow-origin", envvar="LOCALCHAT_ORIGINS", callback=check_origins, metavar="ORIGIN[,ORIGIN]", show_default=False,
    help="Web pages allowed to call the gateway from a browser, beside this machine's own (localhost) [default: "
         "none: a page elsewhere is refused].")]


class DistributedBackend(str, Enum):
    """mlx.launch's backends: TCP ring, Thunderbolt 5 RDMA, MPI, NCCL (CUDA)."""

    ring = "ring"
    jaccl = "jaccl"
    mpi = "mpi"
    nccl = "nccl"


RanksOpt = Annotated[Optional[int], typer.Option(min=1, max=64, help="Serve from N ranks on this machine (loopback, "
                                                                     "ring): mlx.launch, tensor parallel.")]
HostfileOpt = Annotated[Optional[Path], typer.Option(help="mlx.launch's host file: one rank a host (the model "
                                                          "directory must exist on every host).")]
DistributedBackendOpt = Annotated[DistributedBackend, typer.Option(help="mlx.launch's backend with --ranks or "
                                                                         "--hostfile.")]


def ranks_of(count: int | None, hostfile: Path | None, backend: DistributedBackend, pipeline: bool) -> Any:
    """``server.distributed.Ranks`` when the server runs on several ranks, else None."""
    if count is None and hostfile is None:
        if pipeline or backend is not DistributedBackend.ring:
            raise typer.BadParameter("needs --ranks N or --hostfile FILE",
                                     param_hint="--pipeline" if pipeline else "--distributed-backend")
        return None
    from localchat.server.distributed import Ranks

    return Ranks(count=count, hostfile=hostfile, backend=backend.value, pipeline=pipeline)


ServeModelsOpt = Annotated[Optional[list[str]], typer.Option(
    "--model", "-m", envvar="LOCALCHAT_MODEL", show_default=False, metavar="MODEL",
    help=f"The model to serve (repeat -m for several on one port, routed by each request's model): a {MODEL_KINDS} "
         "[default: demo].")]


def check_keep_alive(value: str) -> str:
    from localchat.errors import UsageError
    from localchat.serve.pool.keep_alive import parse_keep_alive

    try:
        parse_keep_alive(value)
    except UsageError as exc:
        raise typer.BadParameter(str(exc)) from None
    return value


KeepAliveOpt = Annotated[str, typer.Option(callback=check_keep_alive, metavar="DURATION",
                                           help="How long an idle model stays loaded: 5m, 30s, 0 (unload after each "
                                                "reply) or never; a request's keep_alive overrides it.")]
PinOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        metavar="MODEL", show_default=False, help="Keep this served model loaded, never unloaded (repeatable)."
    ),
]
UpstreamOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        metavar="NAME=URL",
        show_default=False,
        help="Also route NAME to a server elsewhere (another serve, "
        "mlx_lm.server, llama-server, ollama), never loaded here.",
    ),
]


def check_disk_size(value: str) -> int:
    from localchat.errors import UsageError
    from localchat.sizes import parse_size

    try:
        return parse_size(value)
    except UsageError as exc:
        raise typer.BadParameter(str(exc)) from None


PromptCacheDiskOpt = Annotated[
    str,
    typer.Option(
        metavar="SIZE",
        callback=check_disk_size,
        help="The disk the prompt caches of every served model "
        "may take together (e.g. 10GB; 0: none are kept on disk).",
    ),
]
PromptCacheDirOpt = Annotated[Optional[Path], typer.Option(metavar="DIR", show_default=False, help="Where the prompt "
                                                           "caches go [default: prompt-cache/ in the localchat data "
                                                           "directory].")]

KvBitsOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--kv-bits",
        metavar="BITS|MODEL=BITS",
        show_default=False,
        help="Quantize the KV caches to 8 or 4 bits (2-6, 8), batching kept: for every model, or MODEL=BITS for "
        "one (repeatable).",
    ),
]
KvGroupSizeOpt = Annotated[
    Optional[int],
    typer.Option(metavar="N", show_default=False,
                 help="The KV quantization's group (32, 64, 128) [default: 64, or the largest dividing the heads]."),
]
QuantizedKvStartOpt = Annotated[
    Optional[int],
    typer.Option(metavar="TOKENS", show_default=False,
                 help="Keep a batch's KV cache 16-bit until its longest row holds this many tokens [default: 0]."),
]
