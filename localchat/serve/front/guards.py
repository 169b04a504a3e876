"""The gateway against web pages: a page the user visits must not drive the local model.

Two checks before any route (an ASGI middleware): the ``Host`` header of a gateway bound to
loopback must name that loopback address (a page whose own name resolves to 127.0.0.1, DNS
rebinding, sends its own name), and a request from a browser (it has an ``Origin``) must come from
an allowed origin: this machine's own pages (``http://localhost``, ``http://127.0.0.1``, any port)
and what ``--allow-origin`` adds (ollama's ``OLLAMA_ORIGINS`` convention; ``*`` for any); the chat
page's own API and ``/metrics`` only from the page itself (or an origin ``--allow-origin`` names exactly). SDKs,
curl and coding agents send no ``Origin`` and are not affected. A preflight (``OPTIONS``) from an
allowed origin is answered with CORS headers, and its responses carry them.

Also here: connections whose request headers never finish (slowloris) are closed after
``HEADERS_S`` (uvicorn waits for them forever).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

PAGE_API = "/api/"  # the chat page's own API (``serve.page.api``): same origin only
METRICS_PATH = "/metrics"  # Prometheus's scrape (``front.metrics``): same origin only, like the page's API
HEADERS_S = 10.0  # a request's headers must be whole within this long
ALLOWED_HEADERS = "authorization, content-type, x-api-key, anthropic-version, anthropic-beta, openai-beta, " \
                  "x-stainless-*"


@dataclass(frozen=True)
class BrowserPolicy:
    host: str  # the bound address
    port: int
    origins: tuple[str, ...] = ()  # --allow-origin: exact origins, or "*"

    @property
    def loopback(self) -> bool:
        return _loopback(self.host)

    def host_allowed(self, header: str) -> bool:
        """A loopback gateway answers only to its own names; one bound elsewhere to any (its key guards it)."""
        if not self.loopback or not header:  # (no Host at all: HTTP/1.0, never a browser's request)
            return True
        name = header[:header.find("]") + 1] if header.startswith("[") else header.rsplit(":", 1)[0]
        return _loopback(name)

    def page_origin_allowed(self, origin: str, host: str) -> bool:
        """The chat page's API (``PAGE_API``) takes a browser's request from the page itself only (the
        origin the request was sent to), or from an origin ``--allow-origin`` names: another page of
        this machine, on another port, is another site."""
        return origin in self.origins or (urlsplit(origin).netloc.lower() == host.lower() and bool(host))

    def origin_allowed(self, origin: str) -> bool:
        if "*" in self.origins or origin in self.origins:
            return True
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and (parts.hostname or "") in ("localhost", "127.0.0.1", "::1")


def _loopback(name: str) -> bool:
    """``localhost`` or a loopback address (``127.0.0.1.evil.example`` is neither)."""
    import ipaddress

    if name.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def guarded(app: Any, policy: BrowserPolicy, log: Callable[[str], None]) -> Callable[..., Awaitable[None]]:
    """``app`` behind the two checks; a refusal is a 403 in both APIs' error shape."""

    async def guard(scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        origin = headers.get("origin")
        if not policy.host_allowed(headers.get("host", "")):
            log(f"{scope['method']} {scope['path']} 403 · Host {headers.get('host', '')!r} is not this gateway's "
                "(a page's own name pointed at this machine?)")
            return await _refuse(send, f"this gateway answers requests to {policy.host}:{policy.port} only, not to "
                                       f"{headers.get('host', '')!r}")
        if origin is not None and not policy.origin_allowed(origin):
            log(f"{scope['method']} {scope['path']} 403 · from a web page at {origin!r} (--allow-origin allows one)")
            return await _refuse(send, f"requests from web pages at {origin} are refused: start the gateway with "
                                       f"--allow-origin {origin} to allow them")
        if origin is not None and (scope["path"].startswith(PAGE_API) or scope["path"] == METRICS_PATH) and \
                not policy.page_origin_allowed(origin, headers.get("host", "")):
            log(f"{scope['method']} {scope['path']} 403 · from a page at {origin!r} (the page's own only)")
            return await _refuse(send, f"{scope['path']} answers the page this port serves, not a page at {origin}")
        if origin is not None and scope["method"] == "OPTIONS":
            return await _preflight(send, origin)
        if origin is None:
            return await app(scope, receive, send)

        async def with_cors(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"access-control-allow-origin", origin.encode()),
                                      (b"vary", b"Origin")]
            await send(message)

        return await app(scope, receive, with_cors)

    return guard


async def _refuse(send: Callable, message: str) -> None:
    body = json.dumps({"type": "error", "error": {"type": "permission_error", "message": message,
                                                  "param": None, "code": None}}).encode()
    await send({"type": "http.response.start", "status": 403,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _preflight(send: Callable, origin: str) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": [
        (b"access-control-allow-origin", origin.encode()), (b"vary", b"Origin"),
        (b"access-control-allow-methods", b"GET, POST, DELETE, OPTIONS"),
        (b"access-control-allow-headers", ALLOWED_HEADERS.encode()), (b"access-control-max-age", b"600")]})
    await send({"type": "http.response.body", "body": b""})


def header_deadline_protocol() -> type:
    """uvicorn's httptools protocol (a C parser: the front relays a reply's chunks with the least
    work a chunk), closing a connection whose next request's headers are not whole within
    ``HEADERS_S`` (uvicorn itself waits for them forever: slowloris); each request's scope carries
    the client's socket for a relayed body (``direct_body``)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from localchat.serve.apis.chat_completions.byte_relay import DIRECT_BODY
    from localchat.serve.front.direct_body import ClientSocket

    class HeaderDeadline(HttpToolsProtocol):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            cycle = getattr(self, "cycle", None)
            if cycle is not None and getattr(cycle, "scope", None) is self.scope:
                self.scope.setdefault("extensions", {})[DIRECT_BODY] = ClientSocket(cycle)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def _arm(self) -> None:
            self.loop.call_later(HEADERS_S, self._late)

        def _late(self) -> None:
            waiting = (self.cycle is None or self.cycle.response_complete) and not self.pipeline
            if waiting and not self.transport.is_closing():
                self.transport.close()

    return HeaderDeadline
