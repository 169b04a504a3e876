"""A request to one of our own engine children, relayed byte for byte: the engine names the model
by the id it is served by (``LOCALCHAT_SERVED_ID``), so nothing in its reply is rewritten, and the
reply is read from the socket in whatever pieces arrive and written on as they are (no HTTP client
parses each chunk; mlx_lm.server answers HTTP/1.0 and ends a reply by closing the connection).

The engine's connection is an ``asyncio.Protocol``. Once the head is sent, each piece is written to
the client's socket from its own callback when the server gives that socket (``DIRECT_BODY``:
``serve.front.direct_body``); otherwise the response awaits the pieces and sends one ASGI message
each, still without a stream reader, a generator or ``StreamingResponse`` and its task group
(``scripts/bench_relay_layers.py`` measures each layer). A client that hangs up closes the engine's
connection, and the engine stops generating. What the relay costs a reply is measured by
``scripts/bench_router.py`` (docs/router.md), beside a bare relay that has no HTTP at all.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any, Protocol, cast
from urllib.parse import urlsplit

from starlette.responses import Response

from localchat.serve.request import ApiError

if TYPE_CHECKING:
    from localchat.serve.pool.lease import Lease

HEAD_BYTES = 1 << 16  # an engine's status line and headers: far below this
HELD_BYTES = 1 << 20  # a reply's bytes held for a slow client before the engine's socket is read no more
RESUME_CHECK_S = 0.05
DIRECT_BODY = "localchat.direct_body"  # the scope's extension: the client's socket, when the server gives it


class DirectBody(Protocol):
    """The client's socket below the server's per-message path (``serve.front.direct_body``)."""

    def usable(self) -> bool:
        """Whether a body may be written here now (the head sent, its framing known, the client there)."""

    def write(self, piece: bytes) -> None:
        """``piece`` written on, framed as the response's body is."""

    def unsent(self) -> int:
        """Bytes written but not yet taken by the client."""


class EngineReply(asyncio.Protocol):
    """The engine's side of one request: its answer's head, then its body's pieces as they arrive
    (reading paused while a slow client leaves ``HELD_BYTES`` unsent)."""

    def __init__(self, request: bytes):
        self.request = request
        self.transport: asyncio.Transport | None = None
        self.pieces: list[bytes] = []
        self.held = 0
        self.ended = False
        self.waiter: asyncio.Future[None] | None = None
        self.direct: DirectBody | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's is not a subclass of asyncio's)
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
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
            if not piece or len(seen) > HEAD_BYTES:
                raise ValueError("the engine's answer ended before its headers did")
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

    def __init__(self, reply: EngineReply, first: bytes, status_code: int, headers: dict[str, str], media_type: str,
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


async def engine_relay(method: str, path: str, query: str, content: bytes | None, content_type: str, lease: Lease,
                       log: Callable[[str], None], waited: Callable[[Awaitable[Any]], Awaitable[Any]]) -> Response:
    """The engine's answer streamed back as it comes, with its ``X-Localchat-*`` headers; ``lease``
    given back when it has ended. ``waited`` gives up the wait for the answer's start when the
    client has hung up (None), and the engine then stops generating it (its connection closed)."""
    started, upstream = time.perf_counter(), lease.upstream
    where = urlsplit(upstream.base_url)
    host, port, body = where.hostname or "127.0.0.1", where.port or 80, content or b""
    target = path + (f"?{query}" if query else "")
    reply = EngineReply(f"{method} {target} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {content_type}\r\n"
                        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode("latin-1") + body)
    try:
        opened = await waited(_opened(reply, host, port))
    except (OSError, ValueError, IndexError) as exc:
        raise ApiError(502, "api_error", f"the model's engine: {type(exc).__name__} ({exc})") from None
    if opened is None:
        reply.close()
        lease.release()
        log(f"{method} {path} (relayed) · {upstream.model_id} · the client hung up first")
        return Response(status_code=499)
    status, headers, first = opened

    def ended() -> None:
        lease.release()
        loaded = f" · the model loaded first ({lease.loaded_s:.1f}s)" if lease.loaded_s is not None else ""
        log(f"{method} {path} {status} (relayed) · {upstream.model_id} · {time.perf_counter() - started:.2f}s{loaded}")

    ours = {k: v for k, v in headers.items() if k.startswith("x-localchat-")}
    return RelayedResponse(reply, first, status, ours, headers.get("content-type", "application/json"), ended)


async def _opened(reply: EngineReply, host: str, port: int) -> tuple[int, dict[str, str], bytes]:
    """The request sent, and the answer's status and headers read (the body's first bytes with them)."""
    await asyncio.get_running_loop().create_connection(lambda: reply, host, port)
    try:
        return await reply.head()
    except BaseException:
        reply.close()
        raise
