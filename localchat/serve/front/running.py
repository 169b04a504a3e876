"""The gateway served (uvicorn, in a thread of this process) and known to be ready: a 1-token
request through it succeeds, as ``serve`` knows mlx_lm.server is ready.

uvicorn because it is the ASGI server Starlette is made for, already here with the MCP SDK, and it
streams server-sent events and notices a client that goes away; it runs in a thread so that the
command keeps its own signal handling (Ctrl+C and SIGTERM stop the gateway and the server together).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from rich.console import Console

from localchat.errors import LocalchatError, Termination, UsageError, raise_if_set
from localchat.serve.front.app import Gateway
from localchat.serve.front.guards import BrowserPolicy, guarded, header_deadline_protocol
from localchat.serve.pool.lease import Routes
from localchat.server.launch import LOOPBACK, port_is_free

READY_TIMEOUT_S = 60.0


class GatewayStartError(LocalchatError):
    pass


@dataclass
class RunningGateway:
    server: Any  # uvicorn.Server
    thread: threading.Thread
    url: str  # the public root, e.g. http://127.0.0.1:8080

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop taking requests; open streams get ``grace_s`` to end, then are cut."""
        self.server.should_exit = True
        self.thread.join(grace_s + 1.0)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(2.0)


def start_gateway(gateway: Gateway, host: str, port: int, origins: tuple[str, ...] = ()) -> RunningGateway:
    """The gateway listening, behind the browser checks (``browsers``): its Host, the Origin of a
    web page's request, headers that never finish."""
    import uvicorn

    if not port_is_free(host, port):
        raise GatewayStartError(f"port {port} on {host} is already in use: pick another with --port N")
    app = guarded(gateway.app(), BrowserPolicy(host=host, port=port, origins=origins), lambda line: gateway.log(line))
    config = uvicorn.Config(app, host=host, port=port, log_level="critical", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=5, server_header=False, http=header_deadline_protocol(),
                            loop="uvloop")  # (with httptools: the least work a relayed chunk costs)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="gateway", daemon=True)
    thread.start()
    shown_host = f"[{host}]" if ":" in host else host
    running = RunningGateway(server=server, thread=thread, url=f"http://{shown_host}:{port}")
    deadline = time.monotonic() + 10.0
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            running.stop()
            raise GatewayStartError(f"the gateway could not listen on {host}:{port}")
        time.sleep(0.02)
    return running


def wait_ready(running: RunningGateway, apis: tuple[str, ...], api_key: str | None, model: str,
               on_poll: Callable[[str], None] = lambda _: None, timeout_s: float = READY_TIMEOUT_S) -> float:
    """Seconds until a 1-token request through the gateway succeeds (in each API it serves)."""
    started = time.perf_counter()
    headers = {"x-api-key": api_key} if api_key else {}
    probes = {"anthropic": ("/v1/messages", {"model": model, "max_tokens": 1,
                                             "messages": [{"role": "user", "content": "Hi"}]}),
              "responses": ("/v1/responses", {"model": model, "max_output_tokens": 1, "input": "Hi", "store": False})}
    last = "no answer yet"
    with httpx.Client(timeout=httpx.Timeout(60.0, connect=2.0), headers=headers) as client:
        for api in apis:
            path, body = probes[api]
            while True:
                if not running.alive:
                    raise GatewayStartError("the gateway stopped during start-up")
                try:
                    response = client.post(running.url + path, json=body)
                    if response.status_code == 200:
                        break
                    last = f"HTTP {response.status_code}: {response.text[:200]}"
                except httpx.HTTPError as exc:
                    last = f"{type(exc).__name__}"
                if time.perf_counter() - started > timeout_s:
                    raise GatewayStartError(f"a 1-token request through the gateway ({path}) did not succeed in "
                                            f"{timeout_s:.0f}s: {last}")
                on_poll(f"checking {path} through the gateway … ({last})")
                time.sleep(0.3)
    return time.perf_counter() - started


def serve_gateway(routes: Routes, host: str, port: int, apis: tuple[str, ...], api_key: str | None,
                  log: Callable[[str], None], on_poll: Callable[[str], None] = lambda _: None,
                  origins: tuple[str, ...] = (), model: str = "", web: Any = None,
                  image_urls: tuple[str, ...] = (), metrics: Any = None) -> RunningGateway:
    """The gateway in front of ``routes``, started and ready (or stopped, and the error raised):
    ``model`` answers a 1-token request through each API; ``web`` (a ``serve.page.api.WebApi``) adds the
    chat page. Its own readiness probes are not traffic: the log starts once it is ready."""
    gateway = Gateway(routes, apis=apis, api_key=api_key, extra=web.routes() if web else [],
                      page=web.page if web else None, image_urls=image_urls, metrics=metrics)
    running = start_gateway(gateway, host, port, origins)
    try:
        wait_ready(running, apis, api_key, model, on_poll=on_poll)
    except BaseException:
        running.stop()
        raise
    gateway.log = log
    return running


def serve_until_stopped(running: RunningGateway, terminated: Termination, ended: str) -> int:
    """Serve until Ctrl+C or SIGTERM (success); a front that ends by itself is one line."""
    try:
        while running.alive:
            raise_if_set(terminated)
            time.sleep(0.5)
        raise LocalchatError(ended)
    except KeyboardInterrupt:
        return 0


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
