"""The server's own endpoints through the gateway: ``/v1/chat/completions`` relayed as it comes
(the model named as on every other endpoint of the port), and the model list answered here, with
model ids rather than the server's paths, in a shape both SDKs read.

A chat completion's ``model`` goes upstream as ``Upstream.model_for`` says: a name the server
lists as it is, any other (the id the gateway's banner shows, ``claude-…``) as the gateway's
model. What the server sends back is relayed with the upstream key cut out of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
from starlette.background import BackgroundTask
from starlette.responses import JSONResponse, Response, StreamingResponse

from localchat.backends.http import Redactor, shared_ssl_context
from localchat.serve.pool.pool import not_found_body
from localchat.serve.pool.upstream import Upstream
from localchat.serve.request import MISSING, ApiError

if TYPE_CHECKING:
    from localchat.serve.pool.lease import Lease

T = TypeVar("T")
HANGUP_EVERY_S = 0.25
CREATED = int(datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp())  # a fixed date: a local model has no release


def model_entry(model_id: str) -> dict[str, Any]:
    """One model as OpenAI's list has it (``object``, ``created``, ``owned_by``) and Anthropic's
    (``type``, ``display_name``, ``created_at``)."""
    return {"id": model_id, "object": "model", "created": CREATED, "owned_by": "localchat", "type": "model",
            "display_name": model_id, "created_at": datetime.fromtimestamp(CREATED, timezone.utc).isoformat()
            .replace("+00:00", "Z")}


def model_list(ids: list[str]) -> dict[str, Any]:
    return {"object": "list", "data": [model_entry(i) for i in ids], "has_more": False, "first_id": ids[0],
            "last_id": ids[-1]}


def routing_fields(parsed: dict[str, Any]) -> tuple[str, Any]:
    """What routes a chat completion (checked: ``checked.checked_body``): its ``model`` (``""``
    when it names none) and its ``keep_alive`` (``MISSING`` when it has none)."""
    model = parsed.get("model")
    return (model if isinstance(model, str) else ""), parsed.get("keep_alive", MISSING)


MEDIA_PARTS = ("image_url", "input_image", "image", "input_video", "video_url", "video", "input_audio", "file",
               "input_file")  # what mlx_vlm.server (and others) would fetch or open: a URL or a path


def _references(part: dict[str, Any]) -> list[Any]:
    """The URLs or paths a media part names (``{"image_url": {"url": …}}``, ``{"image_url": …}``,
    ``{"video": …}``, ``{"file_id": …}``…)."""
    found = []
    for key in (part.get("type"), "url", "file_id", "path", "file_url", "image_url"):
        value = part.get(key) if isinstance(key, str) else None
        value = value.get("url", value.get("file_data")) if isinstance(value, dict) else value
        if value is not None:
            found.append(value)
    return found


def check_media(parsed: dict[str, Any], allowed: tuple[str, ...]) -> None:
    """A 400 for a picture (or video, audio, file) given by a URL or a path rather than its data: the
    server behind would fetch a URL on this machine's network (loopback too) or open a local file
    for whoever asks. ``data:`` URLs pass, and URLs starting with a prefix of ``--allow-image-urls``."""
    messages = parsed.get("messages")
    for number, message in enumerate(messages if isinstance(messages, list) else []):
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else []:
            if not isinstance(part, dict) or part.get("type") not in MEDIA_PARTS:
                continue
            for reference in _references(part):
                if isinstance(reference, str) and (reference.startswith("data:") or
                                                   any(reference.startswith(prefix) for prefix in allowed)):
                    continue
                shown = str(reference)[:60]
                raise ApiError(
                    400,
                    "invalid_request_error",
                    f"messages[{number}]: a {part['type']} part must hold "
                    f"its data (a data: URL), not {shown!r}: this server fetches no URL and opens no file "
                    "(serve --allow-image-urls PREFIX allows URLs that start with it)",
                    f"messages[{number}]",
                )


def renamed(body: bytes, parsed: dict[str, Any], upstream: Upstream) -> bytes:
    """A chat completion's body with its model as the server knows it, and without the router's
    own ``keep_alive`` (the bytes as they came when neither changes)."""
    wanted = upstream.model_for(parsed["model"]) if isinstance(parsed.get("model"), str) else parsed.get("model")
    if wanted == parsed.get("model") and "keep_alive" not in parsed:
        return body
    fields = {k: v for k, v in parsed.items() if k != "keep_alive"}
    if "model" in fields:
        fields["model"] = wanted
    return json.dumps(fields, ensure_ascii=False).encode()


async def relay(request_method: str, path: str, query: Any, content: bytes | None, content_type: str,
                lease: Lease, log: Callable[[str], None], gone: Callable[[], Awaitable[bool]]) -> Response:
    """The request sent on as it is (``content`` already checked), the answer streamed back with
    the server's own ``X-Localchat-*`` headers and its model named by id, never by the server's
    own name for it (a path on this machine): byte for byte (``byte_relay``) when nothing in it is
    rewritten, else read with httpx and rewritten; ``lease`` is given back when the answer has ended. A
    client that hangs up before the answer starts closes the request upstream (``gone``), so the
    server stops generating it."""
    started, upstream = time.perf_counter(), lease.upstream
    own_names = _own_names(upstream)
    if not upstream.api_key and not own_names:  # nothing in the reply to rewrite: its bytes as they come
        from localchat.serve.apis.chat_completions.byte_relay import relayed_bytes

        return await relayed_bytes(request_method, path, str(query or ""), content, content_type, lease, log,
                                   lambda work: unless_gone(work, gone))
    headers = {"content-type": content_type}
    if upstream.api_key:
        headers["authorization"] = f"Bearer {upstream.api_key}"
    client = httpx.AsyncClient(timeout=httpx.Timeout(upstream.timeout_s, connect=5.0), verify=shared_ssl_context())
    try:
        sent = client.build_request(request_method, upstream.base_url.removesuffix("/v1") + path, content=content,
                                    headers=headers, params=query)
        response = await unless_gone(client.send(sent, stream=True), gone)
    except httpx.HTTPError as exc:
        await client.aclose()
        raise ApiError(502, "api_error", f"the server behind the gateway: {type(exc).__name__} ({exc})") from None
    if response is None:
        await client.aclose()
        lease.release()
        log(f"{request_method} {path} (passed through) · {upstream.model_id} · the client hung up first")
        return Response(status_code=499)
    redactor = Redactor(upstream.api_key or "", also=own_names)

    async def relayed() -> AsyncIterator[bytes]:
        try:
            async for chunk in response.aiter_raw():
                yield _cut(redactor, chunk)
            yield redactor.flush().encode()
        except httpx.HTTPError:
            pass  # the server went away mid-stream: the client sees the stream end
        finally:
            await response.aclose()
            await client.aclose()
            lease.release()
            loaded = f" · the model loaded first ({lease.loaded_s:.1f}s)" if lease.loaded_s is not None else ""
            log(f"{request_method} {path} {response.status_code} (passed through) · {upstream.model_id} · "
                f"{time.perf_counter() - started:.2f}s{loaded}")

    kind = response.headers.get("content-type", "application/json")
    ours = {k: v for k, v in response.headers.items() if k.lower().startswith("x-localchat-")}
    return StreamingResponse(relayed(), status_code=response.status_code, media_type=kind, headers=ours,
                             background=BackgroundTask(lease.release))


async def unless_gone(work: Awaitable[T], gone: Callable[[], Awaitable[bool]]) -> T | None:
    """``work``'s result, or None (``work`` cancelled) once ``gone()`` says the client hung up."""
    task = asyncio.ensure_future(work)
    while not (await asyncio.wait({task}, timeout=HANGUP_EVERY_S))[0]:
        if await gone():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            return None
    return task.result()


def _own_names(upstream: Upstream) -> dict[str, str]:
    """The server's name for the model when it is a path on this machine (as JSON writes it) →
    the id every client sees."""
    if upstream.writes_id or upstream.model_id in upstream.served or upstream.model_field == upstream.model_id or \
            not upstream.model_field.startswith(("/", "~", "./", "../")):
        return {}  # (the server's replies name the model by its id already: relayed as they come)
    return {json.dumps(upstream.model_field)[1:-1]: json.dumps(upstream.model_id)[1:-1]}


def _cut(redactor: Redactor, chunk: bytes) -> bytes:
    """A chunk with the upstream key cut out and the model named by id (held back where a chunk
    ends inside one)."""
    return redactor.feed(chunk.decode("utf-8", errors="surrogateescape")).encode("utf-8", errors="surrogateescape")


def models_answer(ids: list[str], model_id: str | None = None) -> Response:
    """``/v1/models`` (the list) or ``/v1/models/{id}`` (one, or a 404 in OpenAI's shape)."""
    if model_id is None:
        return JSONResponse(model_list(ids))
    if model_id in ids:
        return JSONResponse(model_entry(model_id))
    return JSONResponse(not_found_body(model_id, ids), status_code=404)
