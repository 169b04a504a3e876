"""``serve --api anthropic,responses`` (mlx_lm.server on an internal loopback port, the gateway on
the public one) and ``gateway --upstream URL`` (the gateway in front of a server already running):
ready when a 1-token request through the gateway succeeds; Ctrl+C and SIGTERM stop both."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from localchat.cli import outcomes
from localchat.cli.pull import fetch_missing
from localchat.cli.serve import heeding, shown_log_on_failure
from localchat.errors import LocalchatError, UsageError, raise_if_set, raise_on_sigterm
from localchat.fit.check import FitSettings
from localchat.gateway.serving import RunningGateway, serve_gateway
from localchat.gateway.upstream import reach_upstream
from localchat.registry import DEFAULT_MODEL, ModelRef, resolve
from localchat.server.distributed import Ranks
from localchat.server.launch import LOOPBACK, free_port, port_is_free, start_ready


def run_serve_api(*, model: str | None, host: str, port: int, log: Path | None, extra: tuple[str, ...],
                  console: Console, err: Console, apis: tuple[str, ...], api_key: str | None,
                  ranks: Ranks | None = None, smoke: bool = False, origins: tuple[str, ...] = (),
                  memory_limit: int | None = None, force: bool = False, allow_download: bool = False,
                  plain: bool = False) -> int:
    ref = resolve(model or DEFAULT_MODEL)
    fit = FitSettings(memory_limit=memory_limit, force=force)
    if allow_download:
        fetch_missing(ref, fit, err)
    _check_public(host, port, api_key, err)
    terminated = raise_on_sigterm()
    internal = free_port()
    with console.status("starting mlx_lm.server …") as status, shown_log_on_failure(console):
        server = start_ready(ref, host="127.0.0.1", port=internal, log=log, extra=extra,
                             on_poll=heeding(terminated, status.update), ranks=ranks, fit=fit, plain=plain)
    running = None
    try:
        upstream = reach_upstream(server.base_url, ref, None)
        with console.status("starting the gateway …") as status:
            running = serve_gateway(upstream, host, port, apis, api_key, _logger(err), status.update, origins)
        console.print(f"[green]ready[/green] {running.url} · {', '.join(apis)} · model {ref.id} · mlx_lm.server on "
                      f"{server.base_url} (loaded in {server.load_s:.1f}s) · log {server.log_path}")
        if smoke:
            return _smoke(running, apis, api_key, ref, console)
        _show_use(console, running, apis)
        while server.process.poll() is None and running.alive:
            raise_if_set(terminated)
            time.sleep(0.5)
        raise LocalchatError("mlx_lm.server ended; the gateway stopped too" if running.alive
                             else "the gateway stopped; mlx_lm.server stopped too")
    except KeyboardInterrupt:
        return outcomes.OK
    finally:
        if running is not None:
            running.stop()
        server.stop()
        console.print("gateway and server stopped", style="dim")


def run_gateway(*, upstream_url: str, model: str | None, host: str, port: int, console: Console, err: Console,
                apis: tuple[str, ...], api_key: str | None, upstream_key: str | None, timeout_s: float,
                origins: tuple[str, ...] = ()) -> int:
    ref = resolve(model) if model else None
    _check_public(host, port, api_key, err)
    terminated = raise_on_sigterm()
    upstream = reach_upstream(upstream_url, ref, upstream_key, timeout_s)
    running = None
    try:
        with console.status("starting the gateway …") as status:
            running = serve_gateway(upstream, host, port, apis, api_key, _logger(err), status.update, origins)
        console.print(f"[green]ready[/green] {running.url} · {', '.join(apis)} · in front of {upstream_url} "
                      f"(model {upstream.model_id})")
        _show_use(console, running, apis)
        while running.alive:
            raise_if_set(terminated)
            time.sleep(0.5)
        raise LocalchatError("the gateway stopped")
    except KeyboardInterrupt:
        return outcomes.OK
    finally:
        if running is not None:
            running.stop()
            console.print("gateway stopped", style="dim")


def _check_public(host: str, port: int, api_key: str | None, err: Console) -> None:
    if not port_is_free(host, port):
        raise UsageError(f"port {port} on {host} is already in use: pick another with --port N")
    if host not in LOOPBACK and api_key is None:
        err.print(f"[yellow]warning: binding {host} without --api-key: anyone who can reach this port can use "
                  "the model[/yellow]")


def _logger(err: Console):
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


def _smoke(running: RunningGateway, apis: tuple[str, ...], api_key: str | None, ref: ModelRef,
           console: Console) -> int:
    from localchat.cli.serve import show_smoke, smoke_api

    reports = [smoke_api(running.url + "/v1", ref, api, api_key=api_key) for api in apis]
    for report in reports:
        show_smoke(console, report, as_json=False)
    return outcomes.report_exit(all(r.ok for r in reports))
