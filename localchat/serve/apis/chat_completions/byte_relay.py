"""A reply relayed byte for byte, from our own engine children and from any server whose reply
needs nothing rewritten (another localchat front behind ``gateway --upstream``, a server that names
the model by its id, no key to cut out): the reply is read from the socket in whatever pieces
arrive and its body written on as it is, with no HTTP client parsing each chunk. Our engines answer
HTTP/1.0 and end a reply by closing the connection; an HTTP/1.1 server's body in chunks or of a
length is read to its end by ``body_framing``.

The upstream's connection is an ``asyncio.Protocol``. Once the head is sent, each piece is written to
the client's socket from its own callback when the server gives that socket (``DIRECT_BODY``:
``serve.front.direct_body``); otherwise the response awaits the pieces and sends one ASGI message
each, still without a stream reader, a generator or ``StreamingResponse`` and its task group
(``scripts/bench_relay_layers.py`` measures each layer). A client that hangs up closes the upstream's
connection, and the engine stops generating. What the relay costs a reply is measured by
``scripts/bench_router.py`` (docs/router.md), beside a bare relay that has no HTTP at all.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast
from urllib.parse import urlsplit

from starlette.responses import Response

from localchat.backends.http import shared_ssl_context
from localchat.serve.apis.chat_completions.body_framing import Framing, FramingError, framing_for
from localchat.serve.request import ApiError

if TYPE_CHECKING:
    from localchat.serve.pool.lease import Lease

HEAD_BYTES = 1 << 16  # an engine's status line and headers: far below this
HELD_BYTES = 1 << 20  # a reply's bytes held for a slow client before the engine's socket is read no more
RESUME_CHECK_S = 0.05
CONNECT_S = 5.0  # a server behind the gateway that does not take the connection in this long is not there
DIRECT_BODY = "localchat.direct_body"  # the scope's extension: the client's socket, when the server gives it


class DirectBody(Protocol):
    """The client's socket below the server's per-message path (``serve.front.direct_body``)."""

    def usable(self) -> bool:
        """Whether a body may be written here now (the head sent, its framing known, the client there)."""

    def write(self, piece: bytes) -> None:
        """``piece`` written on, framed as the response's body is."""

    def unsent(self) -> int:
        """Bytes written but not yet taken by the client."""


class UpstreamReply(asyncio.Protocol):
    """The upstream's side of one request: its answer's head, then its body's pieces as they arrive
    (reading paused while a slow client leaves ``HELD_BYTES`` unsent). With ``idle_limit_s``, an
    upstream that sends nothing for that long is hung up on (``timed_out``)."""

    def __init__(self, request: bytes, idle_limit_s: float | None = None):
        self.request, self.idle_limit_s = request, idle_limit_s
        self.transport: asyncio.Transport | None = None
        self.pieces: list[bytes] = []
        self.held = 0
        self.ended = self.timed_out = False
        self.waiter: asyncio.Future[None] | None = None
        self.direct: DirectBody | None = None
        self.framing: Framing | None = None  # None: the connection's close ends the body
        self.last_s = time.monotonic()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's is not a subclass of asyncio's)
        self.transport.write(self.request)
        if self.idle_limit_s is not None:
            asyncio.get_running_loop().call_later(self.idle_limit_s / 4, self._hang_up_when_idle)

    def data_received(self, data: bytes) -> None:
        self.last_s = time.monotonic()
        if self.framing is not None:
            data = self._payload(data)
            if not data:
                return
        if self.direct is not None:
            self.direct.write(data)
            if self.direct.unsent() > HELD_BYTES and self.transport is not None:
                self.transport.pause_reading()
                asyncio.get_running_loop().call_later(RESUME_CHECK_S, self._resume_when_taken)
            return
        self.pieces.append(data)
        self.held += len(data)
        if self.held > HELD_BYTES and self.transport is not None:
            self.transport.pause_reading()
        self._wake()

    def _payload(self, data: bytes) -> bytes:
        """The body's data in ``data``; the reply ended once its framing says the body is over (or is
        not HTTP's: the client sees the reply end)."""
        assert self.framing is not None
        try:
            data = self.framing.payload(data)
        except FramingError:
            data, self.framing.done = b"", True
        if self.framing.done:
            self.ended = True
            if self.transport is not None:
                self.transport.close()
            self._wake()
        return data

    def _hang_up_when_idle(self) -> None:
        """A silent upstream is hung up on; one we stopped reading (a slow client) is not silent."""
        assert self.idle_limit_s is not None
        if self.ended or self.transport is None:
            return
        if self.held > HELD_BYTES or (self.direct is not None and self.direct.unsent() > 0):
            self.last_s = time.monotonic()
        if time.monotonic() - self.last_s > self.idle_limit_s:
            self.timed_out = True
            self.transport.close()
        else:
            asyncio.get_running_loop().call_later(self.idle_limit_s / 4, self._hang_up_when_idle)

    def start_body(self, rest: bytes) -> bytes:
        """The body's first bytes, those that came with the head (its payload, when framed)."""
        return self._payload(rest) if self.framing is not None else rest

    def send_directly(self, body: DirectBody) -> None:
        """From now on each piece goes to ``body`` as it arrives, with no wake-up of the response."""
        for piece in self.pieces:
            body.write(piece)
        self.pieces.clear()
        self.direct = body
        if self.held > HELD_BYTES and self.transport is not None:
            self.transport.resume_reading()
        self.held = 0

    def _resume_when_taken(self) -> None:
        if self.ended or self.direct is None or self.transport is None:
            return
        if self.direct.unsent() < HELD_BYTES // 2:
            self.transport.resume_reading()
        else:
            asyncio.get_running_loop().call_later(RESUME_CHECK_S, self._resume_when_taken)

    async def finished(self) -> None:
        """Once the engine has ended its reply."""
        while not self.ended:
            await self._woken()

    async def _woken(self) -> None:
        self.waiter = asyncio.get_running_loop().create_future()
        await self.waiter

    def eof_received(self) -> bool:
        self.ended = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True  # (an engine gone mid-reply: the client sees the reply end)
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def received(self) -> bytes:
        """What has arrived since the last call (waiting for something); ``b""`` once the engine has ended."""
        while not self.pieces and not self.ended:
            await self._woken()
        data = self.pieces[0] if len(self.pieces) == 1 else b"".join(self.pieces)
        self.pieces.clear()
        if self.held > HELD_BYTES and self.transport is not None:
            self.transport.resume_reading()
        self.held = 0
        return data

    async def head(self) -> tuple[int, dict[str, str], bytes]:
        """The status and headers (names in lower case), and the body's first bytes that came with them."""
        seen = b""
        while b"\r\n\r\n" not in seen:
            piece = await self.received()
            if not piece:
                raise ValueError("closed the connection before its answer's headers ended")
            if len(seen) > HEAD_BYTES:
                raise ValueError(f"sent headers of over {HEAD_BYTES:,} bytes")
            seen += piece
        head, _, rest = seen.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        return int(lines[0].split(" ", 2)[1]), headers, rest

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class RelayedResponse(Response):
    """The engine's body sent on piece by piece; ``on_end`` once it has ended, however it ended."""

    def __init__(self, reply: UpstreamReply, first: bytes, status_code: int, headers: dict[str, str], media_type: str,
                 on_end: Callable[[], None]):
        self.reply, self.first, self.on_end = reply, first, on_end
        self.status_code, self.media_type, self.background = status_code, media_type, None
        self.init_headers(headers)

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[MutableMapping[str, Any]], Awaitable[None]]) -> None:
        watching = asyncio.ensure_future(self._hangup(receive))
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            direct = scope.get("extensions", {}).get(DIRECT_BODY)
            if direct is not None and direct.usable():  # each piece written as it arrives: no message a piece
                if self.first:
                    direct.write(self.first)
                self.reply.send_directly(direct)
                await self.reply.finished()
            else:
                piece = self.first or await self.reply.received()
                while piece:
                    await send({"type": "http.response.body", "body": piece, "more_body": True})
                    piece = await self.reply.received()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watching.cancel()
            self.reply.close()
            self.on_end()

    async def _hangup(self, receive: Callable[[], Awaitable[Any]]) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.reply.close()  # (the engine sees its connection close, and stops generating)


async def relayed_bytes(method: str, path: str, query: str, content: bytes | None, content_type: str, lease: Lease,
                        log: Callable[[str], None], waited: Callable[[Awaitable[Any]], Awaitable[Any]]) -> Response:
    """The upstream's answer streamed back as it comes, with its ``X-Localchat-*`` headers; ``lease``
    given back when it has ended. ``waited`` gives up the wait for the answer's start when the
    client has hung up (None), and the engine then stops generating it (its connection closed). A
    server behind the gateway (not our engine) that sends nothing for its ``timeout_s`` is hung up on."""
    started, upstream, body = time.perf_counter(), lease.upstream, content or b""
    address = Address.of(upstream.base_url)
    target = address.prefix + path + (f"?{query}" if query else "")
    reply = UpstreamReply(f"{method} {target} HTTP/1.1\r\nHost: {address.host_header}\r\n"
                          f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
                          "\r\n".encode("latin-1") + body, None if upstream.writes_id else upstream.timeout_s)
    whose = "the model's engine" if upstream.writes_id else "the server behind the gateway"
    try:
        opened = await waited(_opened(reply, address, method))
    except (OSError, ValueError, IndexError) as exc:
        cause = f"no answer in {upstream.timeout_s:g}s" if reply.timed_out else \
            str(exc) if type(exc) is ValueError else f"{type(exc).__name__} ({exc})"
        raise ApiError(502, "api_error", f"{whose}: {cause}") from None
    if opened is None:
        reply.close()
        lease.release()
        log(f"{method} {path} (relayed) · {upstream.model_id} · the client hung up first")
        return Response(status_code=499)
    status, headers, first = opened

    def ended() -> None:
        lease.release()
        loaded = f" · the model loaded first ({lease.loaded_s:.1f}s)" if lease.loaded_s is not None else ""
        silent = f" · {whose} sent nothing for {upstream.timeout_s:g}s" if reply.timed_out else ""
        log(f"{method} {path} {status} (relayed) · {upstream.model_id} · "
            f"{time.perf_counter() - started:.2f}s{loaded}{silent}")

    ours = {k: v for k, v in headers.items() if k.startswith("x-localchat-")}
    return RelayedResponse(reply, first, status, ours, headers.get("content-type", "application/json"), ended)


@dataclass(frozen=True)
class Address:
    """Where an upstream's API root is: its host and port, TLS or not, and the path before ``/v1``."""

    host: str
    port: int
    tls: bool
    host_header: str
    prefix: str

    @classmethod
    def of(cls, base_url: str) -> Address:
        where = urlsplit(base_url.removesuffix("/v1"))
        tls = where.scheme == "https"
        return cls(host=where.hostname or "127.0.0.1", port=where.port or (443 if tls else 80), tls=tls,
                   host_header=where.netloc.rpartition("@")[2] or "127.0.0.1", prefix=where.path.rstrip("/"))


async def _opened(reply: UpstreamReply, address: Address, method: str) -> tuple[int, dict[str, str], bytes]:
    """The request sent, and the answer's status and headers read; the body's first bytes that came
    with them (its payload, when it comes framed)."""
    tls = shared_ssl_context() if address.tls else None
    await asyncio.wait_for(asyncio.get_running_loop().create_connection(
        lambda: reply, address.host, address.port, ssl=tls, server_hostname=address.host if tls else None), CONNECT_S)
    try:
        status, headers, rest = await reply.head()
        reply.framing = framing_for(status, headers, method)
        return status, headers, reply.start_body(rest)
    except BaseException:
        reply.close()
        raise
