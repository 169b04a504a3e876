"""How a request of the gateway APIs (Anthropic Messages, Responses) is answered once it is read:
the model leased, its prompt counted, its reply streamed (each API's events) or gathered whole, the
client watched (a client that goes away closes the request upstream), and one log line with its
figures on the one clock. Each API's own reading and reply shapes are in its folder."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from localchat.backends import Event
from localchat.backends.openai_http import PREFIX_CACHE_HEADER, ServerBackend
from localchat.conversation.stats import TurnClock, stats_line
from localchat.serve.apis.anthropic import messages as anthropic_api
from localchat.serve.bodies import sse
from localchat.serve.pool.lease import Lease
from localchat.serve.pool.upstream import Upstream
from localchat.serve.request import ApiError, Ended, GatewayRequest, Idle, aclose

LOOK_S = 1.0  # how often a whole reply in the making looks whether its client is still there


@dataclass
class Replies:
    log: Callable[[str], None] = lambda _: None
    _said: set[str] = field(default_factory=set)

    async def counted_while_connected(self, request: Request, upstream: Upstream,
                                       wanted: GatewayRequest) -> int | None:
        """The prompt's tokens; None when the client went away first (the count upstream is closed)."""
        backend = await run_in_threadpool(upstream.backend, wanted)
        counting = asyncio.ensure_future(run_in_threadpool(upstream.count_tokens, wanted, backend))
        while not counting.done():
            await asyncio.wait([counting], timeout=LOOK_S)
            if not counting.done() and await request.is_disconnected():
                backend.close()  # the thread's request fails at once
                with contextlib.suppress(ApiError):
                    await counting
                return None
        return counting.result()

    async def estimate(self, upstream: Upstream, wanted: GatewayRequest) -> int:
        """The prompt's tokens counted here for ``message_start`` (the server's count comes last)."""
        if upstream.template is None:
            return 0
        try:
            return await run_in_threadpool(upstream.count_tokens, wanted)
        except ApiError:
            return 0  # the request itself says what is wrong, in a moment

    async def reply(self, request: Request, lease: Lease, wanted: GatewayRequest, reply: Any,
                     final: Callable[[Ended], dict], clock: TurnClock, on_end: Callable[[Ended], None] = lambda _: None,
                     before_start: Callable[[], Awaitable[None]] | None = None) -> Response:
        """The reply, streamed or whole; ``lease`` is given back when it has ended, however it ends.
        A stream's first item is awaited before the answer begins, so that a server that is down is
        an error status, not a stream that fails at once. Nothing slow runs on the event loop (a
        request's client and template are made in a thread), so that every other stream's deltas go
        out as they come."""
        self.say_dropped(wanted)
        upstream, streaming = lease.upstream, False
        try:
            await run_in_threadpool(upstream.check_window, wanted)
            backend = await run_in_threadpool(upstream.backend, wanted)
            items = upstream.replies(wanted, backend, clock)
            first = await anext(items)
            if before_start is not None:
                await before_start()
            if isinstance(first, Ended) and first.error is not None:
                await aclose(items)
                raise ApiError(502, "api_error", first.error)
            told = told_by_engine(backend)
            if not wanted.stream:
                return await self.whole(request, lease, reply, first, items, final, clock.submitted, told)
            streaming = True
            return StreamingResponse(self.stream(request, lease, reply, first, items, on_end, clock),
                                     media_type="text/event-stream", headers={"cache-control": "no-cache", **told},
                                     background=BackgroundTask(lease.release))
        finally:
            if not streaming:
                lease.release()

    async def whole(self, request: Request, lease: Lease, reply: Any, first: Event | Idle | Ended,
                     items: AsyncIterator[Event | Idle | Ended], final: Callable[[Ended], dict],
                     started: float, told: dict[str, str]) -> Response:
        ended = await self.gathered(request, reply, first, items)
        if ended is None:
            self.log(f"POST {request.url.path} · the client went away after {time.perf_counter() - started:.2f}s "
                     "(a whole reply); the request to the server was closed")
            return Response(status_code=499)  # (nobody reads it: the connection is gone)
        self.figures(request, lease, ended, started)
        return JSONResponse(final(ended), headers=told)

    async def gathered(self, request: Request, reply: Any, first: Event | Idle | Ended,
                        items: AsyncIterator[Event | Idle | Ended]) -> Ended | None:
        """A whole reply's events gathered into ``reply``, and its end; None when its client went away
        first (looked at every ``LOOK_S`` and at each idle moment: a long prefill, a long answer),
        and the request upstream is closed then, as it is for a stream."""
        item, looked = first, time.monotonic()
        while not isinstance(item, Ended):
            if isinstance(item, Idle) or time.monotonic() - looked > LOOK_S:
                looked = time.monotonic()
                if await request.is_disconnected():
                    await aclose(items)
                    return None
            if not isinstance(item, Idle):
                reply.events(item)
            item = await anext(items)
        return item

    async def stream(self, request: Request, lease: Lease, reply: Any, first: Event | Idle | Ended,
                      items: AsyncIterator[Event | Idle | Ended], on_end: Callable[[Ended], None],
                      clock: TurnClock) -> AsyncIterator[str]:
        started, ended = clock.submitted, None
        try:
            for event in reply.start():
                yield sse(event)
            item: Any = first
            while True:
                if isinstance(item, Idle):
                    yield sse({"type": "ping"}) if isinstance(reply, anthropic_api.MessagesReply) else ": ping\n\n"
                elif isinstance(item, Ended):
                    ended = item
                    for event in reply.end(item):
                        yield sse(event)
                    on_end(item)  # after the end's events: what it keeps is the response they closed
                    return
                else:
                    for event in reply.events(item):
                        yield sse(event)
                item = await anext(items)
        except Exception as exc:  # a bug must not leave a traceback or a stream without its end
            line = f"unexpected {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            ended = Ended(stats=clock.finish(None), finish_reason=None, error=line)
            for event in reply.end(ended):
                yield sse(event)
        finally:
            await aclose(items)  # also when the client went away: the upstream request is closed
            lease.release()
            if ended is None:
                self.log(f"POST {request.url.path} · the client went away after {time.perf_counter() - started:.2f}s;"
                         " the request to the server was closed")
            else:
                self.figures(request, lease, ended, started)

    def say_dropped(self, wanted: GatewayRequest) -> None:
        new = [name for name in wanted.dropped_tools if name not in self._said]
        if new:
            self._said.update(new)
            self.log(f"tools left out (no local model runs them; said once): {', '.join(new)}")

    def figures(self, request: Request, lease: Lease, ended: Ended, started: float) -> None:
        how = f" · stop sequence {ended.stop_sequence!r}" if ended.stop_sequence else ""
        if lease.loaded_s is not None:
            how += f" · the model loaded first ({lease.loaded_s:.1f}s, counted in TTFT)"
        self.log(f"POST {request.url.path} 200 · {lease.upstream.model_id} · {stats_line(ended.stats)}{how}")


def told_by_engine(backend: ServerBackend) -> dict[str, str]:
    """What a serve engine said of the prompt's cache (``X-Localchat-Prefix-Cache``), passed on as it
    came: the gateway's client sees where its prompt broke, as a chat completions client does. Known
    once the engine has answered, before the reply's first event (absent when a first ``Idle`` came
    sooner, or the server is not a serve engine)."""
    said = backend.prefix_cache
    return {PREFIX_CACHE_HEADER: said} if isinstance(said, str) and said.isprintable() else {}
