"""``gateway --upstream URL``: the gateway in front of a server already running, ready when a
1-token request through it succeeds; Ctrl+C and SIGTERM stop it. (``serve --api`` puts the same
gateway in front of the models it serves: ``serve.daemon``.)"""

from __future__ import annotations

from rich.console import Console

from localchat.errors import raise_on_sigterm
from localchat.registry import resolve
from localchat.serve.front.running import RunningGateway, check_public, logger, serve_gateway, serve_until_stopped
from localchat.serve.pool.entries import upstream_pool
from localchat.serve.pool.upstream import reach_upstream


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
            running = serve_gateway(upstream_pool(upstream), host, port, apis, api_key, logger(err), status.update,
                                    origins, model=upstream.model_field, image_urls=image_urls)
        console.print(f"[green]ready[/green] {running.url} · {', '.join(apis)} · in front of {upstream_url} "
                      f"(model {upstream.model_id})")
        _show_use(console, running, apis)
        return serve_until_stopped(running, terminated, "the gateway stopped")
    finally:
        if running is not None:
            running.stop()
            console.print("gateway stopped", style="dim")


def _show_use(console: Console, running: RunningGateway, apis: tuple[str, ...]) -> None:
    console.print("point clients at it:", style="dim")
    if "anthropic" in apis:
        console.print(f"  ANTHROPIC_BASE_URL={running.url}  (Claude Code, the anthropic SDK)", markup=False,
                      overflow="ignore", crop=False)
    if "responses" in apis:
        console.print(f"  base_url={running.url}/v1  (the openai SDK's responses, Codex CLI)", markup=False,
                      overflow="ignore", crop=False)
    console.print("Ctrl+C stops it.", style="dim")
