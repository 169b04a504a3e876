"""The server's own endpoints through the gateway: ``/v1/chat/completions`` relayed as it comes
(the model named as on every other endpoint of the port), and the model list answered here, with
model ids rather than the server's paths, in a shape both SDKs read.

A chat completion's ``model`` goes upstream as ``Upstream.model_for`` says: a name the server
lists as it is, any other (the id the gateway's banner shows, ``claude-…``) as the gateway's
model. What the server sends back is relayed with the upstream key cut out of it.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import httpx
from starlette.background import BackgroundTask
from starlette.responses import JSONResponse, Response, StreamingResponse

from localchat import bounded_json
from localchat.backends.http import Redactor, shared_ssl_context
from localchat.gateway.shapes import MISSING, ApiError
from localchat.gateway.upstream import Upstream

if TYPE_CHECKING:
    from localchat.gateway.routes import Lease

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


def _parsed(body: bytes) -> dict[str, Any] | None:
    try:
        parsed = bounded_json.loads(body)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def routing_fields(body: bytes) -> tuple[str, Any]:
    """What routes a chat completion: its ``model`` (``""`` when it names none) and its
    ``keep_alive`` (``MISSING`` when it has none)."""
    parsed = _parsed(body) or {}
    model = parsed.get("model")
    return (model if isinstance(model, str) else ""), parsed.get("keep_alive", MISSING)


def renamed(body: bytes, upstream: Upstream) -> bytes:
    """A chat completion's body with its model as the server knows it, and without the router's
    own ``keep_alive``; a body that is not a JSON object goes as it is (the server answers for it)."""
    parsed = _parsed(body)
    if parsed is None:
        return body
    wanted = upstream.model_for(parsed["model"]) if isinstance(parsed.get("model"), str) else parsed.get("model")
    if wanted == parsed.get("model") and "keep_alive" not in parsed:
        return body
    fields = {k: v for k, v in parsed.items() if k != "keep_alive"}
    if "model" in fields:
        fields["model"] = wanted
    return json.dumps(fields, ensure_ascii=False).encode()


async def relay(request_method: str, path: str, query: Any, content: bytes | None, content_type: str,
                lease: Lease, log: Callable[[str], None]) -> Response:
    """The request sent on as it is (``content`` already checked), the answer streamed back with
    the server's own ``X-Localchat-*`` headers; ``lease`` is given back when the answer has ended."""
    started, upstream = time.perf_counter(), lease.upstream
    headers = {"content-type": content_type}
    if upstream.api_key:
        headers["authorization"] = f"Bearer {upstream.api_key}"
    client = httpx.AsyncClient(timeout=httpx.Timeout(upstream.timeout_s, connect=5.0), verify=shared_ssl_context())
    try:
        sent = client.build_request(request_method, upstream.base_url.removesuffix("/v1") + path, content=content,
                                    headers=headers, params=query)
        response = await client.send(sent, stream=True)
    except httpx.HTTPError as exc:
        await client.aclose()
        raise ApiError(502, "api_error", f"the server behind the gateway: {type(exc).__name__} ({exc})") from None
    redactor = Redactor(upstream.api_key or "")

    async def relayed() -> AsyncIterator[bytes]:
        try:
            async for chunk in response.aiter_raw():
                yield _cut(redactor, chunk, upstream.api_key)
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


def _cut(redactor: Redactor, chunk: bytes, key: str | None) -> bytes:
    """A chunk with the upstream key cut out (held back where a chunk ends inside it)."""
    if not key:
        return chunk
    return redactor.feed(chunk.decode("utf-8", errors="surrogateescape")).encode("utf-8", errors="surrogateescape")


def models_answer(ids: list[str], model_id: str | None = None) -> Response:
    """``/v1/models`` (the list) or ``/v1/models/{id}`` (one, or a 404 in OpenAI's shape)."""
    if model_id is None:
        return JSONResponse(model_list(ids))
    if model_id in ids:
        return JSONResponse(model_entry(model_id))
    return JSONResponse(not_found_body(model_id, ids), status_code=404)


def not_found_body(model_id: str, ids: list[str]) -> dict[str, Any]:
    """A model this port does not serve, in OpenAI's error shape (which Anthropic's SDK reads too)."""
    shown = model_id if len(model_id) <= 80 else model_id[:80] + "…"
    message = f"no model {shown!r} here: this server serves {', '.join(ids)}"
    return {"error": {"message": message, "type": "not_found_error", "param": "model", "code": "model_not_found"},
            "type": "error"}

