"""The gateway's ASGI app (Starlette): ``/v1/messages`` and ``/v1/messages/count_tokens``
(Anthropic), ``/v1/responses`` (OpenAI, and its stored responses), ``/v1/models`` (model ids, in
a shape both SDKs read), and ``/v1/chat/completions`` and ``/health`` passed through to the server.

Every request is checked before anything reaches the server: its key (``x-api-key`` or a Bearer
header, when the gateway has one), its size (``MAX_BODY_BYTES``, refused as it arrives), its JSON.
Every failure is an error in the API's own shape; a stream that fails after it began ends with the
API's error event. One line a request goes to ``log``: what was asked, its status, and its figures
on the one clock (``[TTFT 0.21s · 38.5 tok/s · in 274 (cached 256) · out 52 · 1.62s]``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localchat.conversation.stats import TurnClock
from localchat.serve.apis.anthropic import messages as anthropic_api
from localchat.serve.apis.chat_completions import passthrough
from localchat.serve.apis.chat_completions.checked import checked_body
from localchat.serve.apis.names import APIS
from localchat.serve.apis.replying import Replies
from localchat.serve.apis.responses import responses as responses_api
from localchat.serve.apis.responses.reply import ResponsesReply
from localchat.serve.apis.responses.stored import ResponseStore
from localchat.serve.bodies import json_body, raw_body
from localchat.serve.front.guards import METRICS_PATH
from localchat.serve.front.metrics import CONTENT_TYPE, ServeMetrics, counted, leased
from localchat.serve.pool.lease import Lease, Routes
from localchat.serve.request import MISSING, ApiError, Ended, check_key

PS_PATH = "/localchat/ps"  # what ``localchat ps`` reads: the models this port holds


@dataclass
class Gateway:
    routes: Routes  # the server for each model a request names (``serve.pool``)
    apis: tuple[str, ...] = APIS
    api_key: str | None = None  # what clients must present; None: loopback use without a key
    log: Callable[[str], None] = lambda _: None
    store: ResponseStore = field(default_factory=ResponseStore)
    extra: list[Route] = field(default_factory=list)  # the chat page's API (``serve.page.api``), on ``serve``
    page: Callable[[Request], Awaitable[Response]] | None = None  # ``/`` to a browser, on ``serve``
    image_urls: tuple[str, ...] = ()  # --allow-image-urls: URL prefixes a picture may name (else data: only)
    metrics: ServeMetrics | None = None  # ``/metrics``; None: made for ``routes`` alone
    replies: Replies = field(init=False)

    def __post_init__(self) -> None:
        self.replies = Replies(log=lambda line: self.log(line))  # (the log is set once the port is ready)
        if self.metrics is None:
            self.metrics = ServeMetrics(self.routes.status)

    def app(self) -> Callable[..., Awaitable[None]]:
        routes = [Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                  Route("/v1/completions", self.chat_completions, methods=["POST"]),  # (the engine serves it too)
                  Route("/health", self.health, methods=["GET"]),
                  Route("/v1/models", self.models, methods=["GET"]),
                  Route("/v1/models/{model_id:path}", self.models, methods=["GET"]),
                  Route(PS_PATH, self.held, methods=["GET"]),
                  Route(METRICS_PATH, self.scraped, methods=["GET"]),
                  Route("/", self.root, methods=["GET", "HEAD"]), *self.extra]  # clients check something answers
        if "anthropic" in self.apis:
            routes += [Route("/v1/messages", self.messages, methods=["POST"]),
                       Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"])]
        if "responses" in self.apis:
            routes += [Route("/v1/responses", self.responses, methods=["POST"]),
                       Route("/v1/responses/{response_id}", self.stored_response, methods=["GET", "DELETE"])]
        assert self.metrics is not None
        return counted(Starlette(routes=routes, exception_handlers={HTTPException: self._http_error,
                                                                    ApiError: self._refused, Exception: self._bug}),
                       self.metrics)

    # --- the two APIs ----------------------------------------------------------------------------------

    async def messages(self, request: Request) -> Response:
        clock = TurnClock()  # from the request's arrival: reading, loading and templating count in its TTFT
        lease = None
        try:
            self._authorized(request)
            body = await json_body(request)
            wanted = anthropic_api.read_request(body)
            lease = await self._lease(request, wanted.model, body)
            reply = anthropic_api.MessagesReply(model=wanted.model)
            upstream = lease.upstream
            counting = asyncio.ensure_future(self.replies.estimate(upstream, wanted)) if wanted.stream else None

            async def counted() -> None:  # message_start's estimate, counted while the server prefills
                reply.input_estimate = await counting if counting is not None else 0

            return await self.replies.reply(request, lease, wanted, reply, reply.message, clock, before_start=counted)
        except ApiError as exc:
            if lease is not None:
                lease.release()
            return self._error(request, exc, anthropic_api.error_body, clock.submitted)

    async def count_tokens(self, request: Request) -> Response:
        started = time.perf_counter()
        lease = None
        try:
            self._authorized(request)
            body = await json_body(request)
            wanted = anthropic_api.read_request(body, counting=True)
            lease = await self._lease(request, wanted.model, body)
            tokens = await self.replies.counted_while_connected(request, lease.upstream, wanted)
            if tokens is None:
                self.log(f"POST {request.url.path} · the client went away; the count upstream was closed")
                return Response(status_code=499)  # (nobody reads it: the connection is gone)
        except ApiError as exc:
            return self._error(request, exc, anthropic_api.error_body, started)
        finally:
            if lease is not None:
                lease.release()
        self.log(f"POST {request.url.path} 200 · {tokens} input tokens · {time.perf_counter() - started:.2f}s")
        return JSONResponse({"input_tokens": tokens})

    async def responses(self, request: Request) -> Response:
        clock = TurnClock()
        lease = None
        try:
            self._authorized(request)
            body = await json_body(request)
            wanted = responses_api.read_request(body, self.store)
            lease = await self._lease(request, wanted.model, body)
            reply = ResponsesReply(request=wanted, body=body)

            def final(ended: Ended) -> dict[str, Any]:  # a whole reply: made once, kept as it was returned
                response = reply.final(ended)
                self._keep(body, reply, response)
                return response

            def streamed(ended: Ended) -> None:
                if ended.error is None:
                    self._keep(body, reply, reply.final(ended))

            return await self.replies.reply(request, lease, wanted, reply, final, clock, on_end=streamed)
        except ApiError as exc:
            if lease is not None:
                lease.release()
            return self._error(request, exc, responses_api.error_body, clock.submitted)

    def _keep(self, body: dict[str, Any], reply: ResponsesReply, response: dict[str, Any]) -> None:
        if body.get("store", True) is not False:
            self.store.keep(reply.id, reply.conversation(), response)

    async def _lease(self, request: Request, name: str, body: Any) -> Lease:
        """The model a request names, loaded if it must be (in a thread: a load takes seconds);
        ``keep_alive`` in the body, as ollama takes it, sets how long it stays loaded after."""
        keep_alive = body.get("keep_alive", MISSING) if isinstance(body, dict) else MISSING
        return leased(request, await run_in_threadpool(self.routes.lease, name, keep_alive))

    async def root(self, request: Request) -> Response:
        """The chat page to a browser; to other clients what this port serves."""
        if self.page is not None and "text/html" in request.headers.get("accept", ""):
            return await self.page(request)
        ids = self.routes.model_ids()
        answer = {"name": "localchat gateway", "apis": list(self.apis), "model": ids[0], "models": ids}
        if self.page is not None:
            answer["page"] = f"{request.base_url}  (the chat page: open it in a browser)"
        return JSONResponse(answer)

    async def scraped(self, request: Request) -> Response:
        """``GET /metrics``: Prometheus's scrape (behind the key; never to a foreign page: ``guards``)."""
        self._authorized(request)
        assert self.metrics is not None
        return Response(await run_in_threadpool(self.metrics.text), media_type=CONTENT_TYPE)

    async def held(self, request: Request) -> Response:
        """``GET /localchat/ps``: the models this port holds (``localchat ps``)."""
        self._authorized(request)
        return JSONResponse(await run_in_threadpool(self.routes.status))

    # --- passed through --------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        upstream = self.routes.health_upstream()
        if upstream is None:  # a router: it answers, whatever is loaded (as mlx_lm.server does before its load)
            return JSONResponse({"status": "ok"})
        return await self._passed(request, None, Lease(upstream=upstream))

    async def chat_completions(self, request: Request) -> Response:
        """Chat completions as the server has them, the model named as on every endpoint here."""
        started = time.perf_counter()
        try:
            self._authorized(request)
            raw = await raw_body(request)
            parsed = checked_body(raw, "prompt" if request.url.path.endswith("/completions") and
                                  "/chat/" not in request.url.path else "messages")
            passthrough.check_media(parsed, self.image_urls)
            name, keep_alive = passthrough.routing_fields(parsed)
            lease = leased(request, await run_in_threadpool(self.routes.lease, name, keep_alive))
        except ApiError as exc:
            return self._error(request, exc, responses_api.error_body, started)
        return await self._passed(request, passthrough.renamed(raw, parsed, lease.upstream), lease)

    async def _passed(self, request: Request, body: bytes | None, lease: Lease) -> Response:
        try:
            return await passthrough.relay(request.method, request.url.path, request.query_params, body,
                                           request.headers.get("content-type", "application/json"), lease,
                                           self.log, request.is_disconnected)
        except ApiError as exc:
            lease.release()
            return self._error(request, exc, responses_api.error_body, time.perf_counter())

    async def models(self, request: Request) -> Response:
        self._authorized(request)
        return passthrough.models_answer(self.routes.model_ids(), request.path_params.get("model_id"))

    async def stored_response(self, request: Request) -> Response:
        """``GET`` or ``DELETE /v1/responses/{id}``: a response kept with ``store``."""
        response_id = request.path_params["response_id"]
        self._authorized(request)
        if request.method == "DELETE":
            self.store.delete(response_id)
            return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})
        return JSONResponse(self.store.response(response_id))

    # --- checks, errors and the log ----------------------------------------------------------------------

    def _authorized(self, request: Request) -> None:
        check_key(request.headers, self.api_key)

    def _error(self, request: Request, error: ApiError, shape: Callable[[ApiError], dict], started: float) -> Response:
        self.log(f"{request.method} {request.url.path} {error.status} · {error.message} · "
                 f"{time.perf_counter() - started:.2f}s")
        return JSONResponse(shape(error), status_code=error.status)

    def _shape_for(self, request: Request) -> Callable[[ApiError], dict]:
        return anthropic_api.error_body if request.url.path.startswith("/v1/messages") else responses_api.error_body

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        kind = {404: "not_found_error", 405: "invalid_request_error"}.get(status, "api_error")
        message = {404: f"no such endpoint: {request.url.path}",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(status, str(exc))
        return self._error(request, ApiError(status, kind, message), self._shape_for(request), time.perf_counter())

    async def _refused(self, request: Request, exc: Exception) -> Response:
        """An ``ApiError`` a handler did not answer itself (a key, a stored response not found)."""
        assert isinstance(exc, ApiError)
        return self._error(request, exc, self._shape_for(request), time.perf_counter())

    async def _bug(self, request: Request, exc: Exception) -> Response:
        line = f"unexpected {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return self._error(request, ApiError(500, "api_error", line), self._shape_for(request), time.perf_counter())
