"""The chat page and its API, served by the front beside the model APIs (docs/web.md):

    GET  /                              the page (to a browser; other clients get the JSON they had)
    GET  /static/{file}                 its script, style and Markdown renderer (shipped in the wheel)
    GET  /api/models                    the models served: [{"id", "vision"}]
    GET  /api/chats?q=                  the conversation log, the latest first (or searched)
    POST /api/chats                     a new conversation {model, system, temperature, history}
    GET  /api/chats/{id}                one conversation: its settings and accepted turns
    PATCH /api/chats/{id}               {system, temperature, history, model}
    POST /api/chats/{id}/turns          {kind: ask|retry|edit, text, images: [data URLs]}: the turn streamed
                                        as server-sent events (text, reasoning, tool_call, approve, end)
    POST /api/chats/{id}/stop           the reply in progress discarded, as Ctrl+C does
    POST /api/chats/{id}/approval       {decision: approve|deny|always} for the call waiting
    POST /api/chats/{id}/undo           the last accepted turn taken back
    GET  /api/results                   the plots of ``serve --results DIR``; GET /api/results/{name}: one

Every ``/api`` request carries the serve's ``--api-key`` when it has one. The page runs no inline
script (its Content-Security-Policy says so) and never turns text into HTML.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from localchat.errors import LocalchatError
from localchat.sampling import check_setting
from localchat.serve.bodies import json_body
from localchat.serve.page.chats import WebChats
from localchat.serve.request import ApiError, check_key
from localchat.store.saved_sessions import SessionNotFound

STATIC = Path(__file__).parent / "static"
ASSETS = {"app.js": "text/javascript", "markdown.js": "text/javascript", "style.css": "text/css"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
PAGE_HEADERS = {"content-security-policy": CSP, "x-content-type-options": "nosniff", "referrer-policy": "no-referrer",
                "cache-control": "no-cache", "x-frame-options": "DENY"}
MAX_PICTURES = 4


@dataclass
class WebApi:
    chats: WebChats
    api_key: str | None = None
    vision: frozenset[str] = frozenset()  # the served models that take pictures
    results: Path | None = None  # ``serve --results DIR``: bench and load plots shown in the page

    def routes(self) -> list[Route]:
        return [Route("/static/{name}", self.asset, methods=["GET"]),
                Route("/api/models", self.models, methods=["GET"]),
                Route("/api/chats", self.listed, methods=["GET"]),
                Route("/api/chats", self.started, methods=["POST"]),
                Route("/api/chats/{uid}", self.one, methods=["GET", "PATCH"]),
                Route("/api/chats/{uid}/turns", self.turn, methods=["POST"]),
                Route("/api/chats/{uid}/stop", self.stop, methods=["POST"]),
                Route("/api/chats/{uid}/approval", self.approval, methods=["POST"]),
                Route("/api/chats/{uid}/undo", self.undo, methods=["POST"]),
                Route("/api/results", self.plots, methods=["GET"]),
                Route("/api/results/{name}", self.plot, methods=["GET"])]

    # --- the page ------------------------------------------------------------------------------

    async def page(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html", headers=PAGE_HEADERS)

    async def asset(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ASSETS:
            return JSONResponse({"error": {"message": f"no such file: {name[:80]}"}}, status_code=404)
        return FileResponse(STATIC / name, media_type=ASSETS[name], headers=PAGE_HEADERS)

    # --- the API ---------------------------------------------------------------------------------

    async def models(self, request: Request) -> Response:
        return await self._answered(request, lambda: [{"id": m, "vision": m in self.vision}
                                                       for m in self.chats.served()])

    async def listed(self, request: Request) -> Response:
        query = request.query_params.get("q") or None
        return await self._answered(request, lambda: self.chats.listed(query))

    async def started(self, request: Request) -> Response:
        async def respond() -> Response:
            body = await self._body(request)
            return JSONResponse(await run_in_threadpool(lambda: self.chats.shown(self.chats.started(
                _text(body, "model"), _text(body, "system"), _temperature(body),
                body.get("history", True) is not False).uid)))

        return await self._guarded(request, respond)

    async def one(self, request: Request) -> Response:
        uid = request.path_params["uid"]
        if request.method == "GET":
            return await self._answered(request, lambda: self.chats.shown(uid))

        async def respond() -> Response:
            body = await self._body(request)
            return JSONResponse(await run_in_threadpool(lambda: self.chats.settings(
                uid, system=body.get("system"), temperature=body.get("temperature"), history=body.get("history"),
                model=body.get("model"))))

        return await self._guarded(request, respond)

    async def turn(self, request: Request) -> Response:
        async def respond() -> Response:
            body = await json_body(request)
            if not isinstance(body, dict):
                raise ApiError(400, "invalid_request_error", "the body is a JSON object")
            kind, text = body.get("kind", "ask"), body.get("text", "")
            if kind not in ("ask", "retry", "edit") or not isinstance(text, str):
                raise ApiError(400, "invalid_request_error", "kind is ask, retry or edit, and text a string")
            pictures = await run_in_threadpool(_pictures, body.get("images") or [])
            events = await run_in_threadpool(self._first, request.path_params["uid"], kind, text, pictures)
            return StreamingResponse(
                _sse(events), media_type="text/event-stream", headers={"cache-control": "no-cache"}
            )

        return await self._guarded(request, respond)

    def _first(self, uid: str, kind: str, text: str, pictures: tuple) -> Iterator[dict[str, Any]]:
        """The turn's events, its refusals (busy, bad input) raised before the stream begins."""
        events = self.chats.turn(uid, kind, text, pictures)
        first = next(events)
        if first["type"] == "error":
            raise LocalchatError(first["message"])

        def all_of() -> Iterator[dict[str, Any]]:
            yield first
            yield from events

        return all_of()

    async def stop(self, request: Request) -> Response:
        uid = request.path_params["uid"]
        return await self._answered(request, lambda: {"stopping": self.chats.stop(uid)})

    async def approval(self, request: Request) -> Response:
        uid = request.path_params["uid"]

        async def respond() -> Response:
            body = await self._body(request)
            await run_in_threadpool(self.chats.decide, uid, str(body.get("decision")))
            return JSONResponse({})

        return await self._guarded(request, respond)

    async def undo(self, request: Request) -> Response:
        uid = request.path_params["uid"]
        return await self._answered(request, lambda: self.chats.undo(uid))

    async def plots(self, request: Request) -> Response:
        results = self.results
        return await self._answered(request, lambda: sorted(
            p.name for p in results.glob("*.png") if _plot_file(results, p.name)) if results else [])

    async def plot(self, request: Request) -> Response:
        async def respond() -> Response:
            name = request.path_params["name"]
            path = _plot_file(self.results, name) if self.results else None
            if path is None:
                return _error(404, f"no plot {name[:80]!r}")
            return FileResponse(path, media_type="image/png", headers={"cache-control": "no-cache"})

        return await self._guarded(request, respond)

    async def _body(self, request: Request) -> dict[str, Any]:
        """The request's JSON object; anything else (malformed, not an object) is a 400 that says so."""
        body = await json_body(request)
        if not isinstance(body, dict):
            raise ApiError(400, "invalid_request_error", "the body must be a JSON object")
        return body

    async def _answered(self, request: Request, work: Callable[[], Any]) -> Response:
        """``work``'s answer as JSON, in a thread."""
        async def respond() -> Response:
            return JSONResponse(await run_in_threadpool(work))

        return await self._guarded(request, respond)

    async def _guarded(self, request: Request, respond: Callable[[], Awaitable[Response]]) -> Response:
        """``respond``'s answer when the request carries the key; a refusal as one line in an error object."""
        try:
            check_key(request.headers, self.api_key)
            return await respond()
        except ApiError as exc:
            return _error(exc.status, exc.message)
        except SessionNotFound as exc:
            return _error(404, str(exc))
        except LocalchatError as exc:
            return _error(400, str(exc))


def _plot_file(results: Path, name: str) -> Path | None:
    """``results/name`` when it is a regular PNG file directly inside ``results`` (no link, no
    directory, no name that leaves it or that no file system takes), else None."""
    import os
    import stat

    if not name.endswith(".png") or len(name) > 200 or any(c in name for c in "/\\\0") or name.startswith("."):
        return None
    path = results / name
    try:
        return path if stat.S_ISREG(os.lstat(path).st_mode) else None
    except OSError:
        return None


def _error(status: int, message: str) -> Response:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def _text(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise LocalchatError(f"{name} is a string")
    return value


def _temperature(body: dict[str, Any]) -> float | None:
    """The temperature by the one rule ``chat`` and ``/set`` use (``sampling``)."""
    value = body.get("temperature")
    return None if value is None else check_setting("temperature", value)


def _pictures(urls: Any) -> tuple:
    """Pictures pasted or dropped in the page, as data URLs: each read and checked as ``--image``."""
    from localchat.vision.image import bytes_of_data_url, picture_from_bytes

    if not isinstance(urls, list) or len(urls) > MAX_PICTURES or not all(isinstance(u, str) for u in urls):
        raise LocalchatError(f"images is a list of at most {MAX_PICTURES} data URLs")
    pictures = []
    for number, url in enumerate(urls, 1):
        if not url.startswith("data:image/"):
            raise LocalchatError("a picture comes as a data URL (data:image/…): nothing else is read")
        pictures.append(picture_from_bytes(bytes_of_data_url(url), f"pasted-{number}.png", where="the page"))
    return tuple(pictures)


def _sse(events: Iterator[dict[str, Any]]) -> Iterator[str]:
    for event in events:
        yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
