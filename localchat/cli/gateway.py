"""``gateway --upstream URL``: the gateway in front of a server already running, ready when a
1-token request through it succeeds; Ctrl+C and SIGTERM stop it. (``serve --api`` puts the same
gateway in front of the models it serves: ``cli.serving``.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rich.console import Console

from localchat.cli import outcomes
from localchat.errors import LocalchatError, UsageError, raise_if_set, raise_on_sigterm
from localchat.gateway.routes import FixedRoute
from localchat.gateway.serving import RunningGateway, serve_gateway
from localchat.gateway.upstream import reach_upstream
from localchat.registry import resolve
from localchat.server.launch import LOOPBACK, port_is_free


def run_gateway(*, upstream_url: str, model: str | None, host: str, port: int, console: Console, err: Console,
                apis: tuple[str, ...], api_key: str | None, upstream_key: str | None, timeout_s: float,
                origins: tuple[str, ...] = (), image_urls: tuple[str, ...] = ()) -> int:
    ref = resolve(model) if model else None
    check_public(host, port, api_key, err)
    terminated = raise_on_sigterm()
    upstream = reach_upstream(upstream_url, ref, upstream_key, timeout_s)
    running = None
    try:
        with console.status("starting the gateway …") as status:
            running = serve_gateway(FixedRoute(upstream), host, port, apis, api_key, logger(err), status.update,
                                    origins, model=upstream.model_field, image_urls=image_urls)
        console.print(f"[green]ready[/green] {running.url} · {', '.join(apis)} · in front of {upstream_url} "
                      f"(model {upstream.model_id})")
        _show_use(console, running, apis)
        return serve_until_stopped(running, terminated, "the gateway stopped")
    finally:
        if running is not None:
            running.stop()
            console.print("gateway stopped", style="dim")


def serve_until_stopped(running: RunningGateway, terminated: threading.Event, ended: str) -> int:
    """Serve until Ctrl+C or SIGTERM (success); a front that ends by itself is one line."""
    try:
        while running.alive:
            raise_if_set(terminated)
            time.sleep(0.5)
        raise LocalchatError(ended)
    except KeyboardInterrupt:
        return outcomes.OK


def check_public(host: str, port: int, api_key: str | None, err: Console) -> None:
    """A port already taken is one line; a public address without a key is warned about."""
    if not port_is_free(host, port):
        raise UsageError(f"port {port} on {host} is already in use: pick another with --port N")
    if host not in LOOPBACK and api_key is None:
        err.print(f"[yellow]warning: binding {host} without --api-key: anyone who can reach this port can use "
                  "the model[/yellow]")


def logger(err: Console) -> Callable[[str], None]:
    """The front's log: a line a request, dim, on stderr."""
    return lambda line: err.print(line, style="dim", markup=False, highlight=False)


def _show_use(console: Console, running: RunningGateway, apis: tuple[str, ...]) -> None:
    console.print("point clients at it:", style="dim")
    if "anthropic" in apis:
        console.print(f"  ANTHROPIC_BASE_URL={running.url}  (Claude Code, the anthropic SDK)", markup=False,
                      overflow="ignore", crop=False)
    if "responses" in apis:
        console.print(f"  base_url={running.url}/v1  (the openai SDK's responses, Codex CLI)", markup=False,
                      overflow="ignore", crop=False)
    console.print("Ctrl+C stops it.", style="dim")
