"""A request to one of our own engine children, relayed byte for byte: the engine names the model
by the id it is served by (``LOCALCHAT_SERVED_ID``), so nothing in its reply is rewritten, and the
reply is read from the socket in whatever pieces arrive and written on as they are (no HTTP client
parses each chunk; mlx_lm.server answers HTTP/1.0 and ends a reply by closing the connection).

What this costs a reply is measured by ``scripts/bench_router.py`` (docs/router.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from localchat.serve.request import ApiError

if TYPE_CHECKING:
    from localchat.serve.pool.lease import Lease

READ_BYTES = 1 << 16
HEAD_BYTES = 1 << 16  # an engine's status line and headers: far below this


async def engine_relay(method: str, path: str, query: str, content: bytes | None, content_type: str, lease: Lease,
                       log: Callable[[str], None], waited: Callable[[Awaitable[Any]], Awaitable[Any]]) -> Response:
    """The engine's answer streamed back as it comes, with its ``X-Localchat-*`` headers; ``lease``
    given back when it has ended. ``waited`` gives up the wait for the answer's start when the
    client has hung up (None), and the engine then stops generating it (its connection closed)."""
    started, upstream = time.perf_counter(), lease.upstream
    where = urlsplit(upstream.base_url)
    try:
        opened = await waited(_opened(where.hostname or "127.0.0.1", where.port or 80, method,
                                      path + (f"?{query}" if query else ""), content or b"", content_type))
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
        raise ApiError(502, "api_error", f"the model's engine: {type(exc).__name__} ({exc})") from None
    if opened is None:
        lease.release()
        log(f"{method} {path} (relayed) · {upstream.model_id} · the client hung up first")
        return Response(status_code=499)
    status, headers, reader, writer = opened

    async def relayed() -> AsyncIterator[bytes]:
        try:
            while chunk := await reader.read(READ_BYTES):
                yield chunk
        except OSError:
            pass  # the engine went away mid-reply: the client sees the reply end
        finally:
            writer.close()
            lease.release()
            loaded = f" · the model loaded first ({lease.loaded_s:.1f}s)" if lease.loaded_s is not None else ""
            log(f"{method} {path} {status} (relayed) · {upstream.model_id} · "
                f"{time.perf_counter() - started:.2f}s{loaded}")

    ours = {k: v for k, v in headers.items() if k.startswith("x-localchat-")}
    return StreamingResponse(relayed(), status_code=status, media_type=headers.get("content-type", "application/json"),
                             headers=ours, background=BackgroundTask(lease.release))


async def _opened(host: str, port: int, method: str, target: str, body: bytes,
                  content_type: str) -> tuple[int, dict[str, str], asyncio.StreamReader, asyncio.StreamWriter]:
    """The request sent, and the answer's status and headers read (the body left on the reader)."""
    reader, writer = await asyncio.open_connection(host, port, limit=HEAD_BYTES)
    try:
        writer.write(f"{method} {target} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {content_type}\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode("latin-1") + body)
        await writer.drain()
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ", 2)[1])
    except BaseException:
        writer.close()
        raise
    headers = {}
    for line in head[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return status, headers, reader, writer
