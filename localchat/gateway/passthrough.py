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
from typing import Any

import httpx
from starlette.responses import JSONResponse, Response, StreamingResponse

from localchat.backends.http import Redactor, shared_ssl_context
from localchat.gateway.shapes import ApiError
from localchat.gateway.upstream import Upstream

CREATED = int(datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp())  # a fixed date: a local model has no release


def model_ids(upstream: Upstream) -> list[str]:
    """The names a client can use: the gateway's model, or, in front of a server whose model it
    was not told, the ids that server lists (never a local path)."""
    if upstream.named:
        return [upstream.model_id]
    return sorted(name for name in upstream.served if not name.startswith("/")) or ["default_model"]


def model_entry(model_id: str) -> dict[str, Any]:
    """One model as OpenAI's list has it (``object``, ``created``, ``owned_by``) and Anthropic's
    (``type``, ``display_name``, ``created_at``)."""
    return {"id": model_id, "object": "model", "created": CREATED, "owned_by": "localchat", "type": "model",
            "display_name": model_id, "created_at": datetime.fromtimestamp(CREATED, timezone.utc).isoformat()
            .replace("+00:00", "Z")}


def model_list(upstream: Upstream) -> dict[str, Any]:
    ids = model_ids(upstream)
    return {"object": "list", "data": [model_entry(i) for i in ids], "has_more": False, "first_id": ids[0],
            "last_id": ids[-1]}


def renamed(body: bytes, upstream: Upstream) -> bytes:
    """A chat completion's body with its model as the server knows it; a body that is not a JSON
    object goes as it is (the server answers for it)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return body
    if not isinstance(parsed, dict) or not isinstance(parsed.get("model"), str):
        return body
    wanted = upstream.model_for(parsed["model"])
    if wanted == parsed["model"]:
        return body
    return json.dumps({**parsed, "model": wanted}, ensure_ascii=False).encode()


async def relay(request_method: str, path: str, query: Any, content: bytes | None, content_type: str,
                upstream: Upstream, log: Callable[[str], None]) -> Response:
    """The request sent on as it is (``content`` already checked), the answer streamed back."""
    started = time.perf_counter()
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
            log(f"{request_method} {path} {response.status_code} (passed through) · "
                f"{time.perf_counter() - started:.2f}s")

    kind = response.headers.get("content-type", "application/json")
    return StreamingResponse(relayed(), status_code=response.status_code, media_type=kind)


def _cut(redactor: Redactor, chunk: bytes, key: str | None) -> bytes:
    """A chunk with the upstream key cut out (held back where a chunk ends inside it)."""
    if not key:
        return chunk
    return redactor.feed(chunk.decode("utf-8", errors="surrogateescape")).encode("utf-8", errors="surrogateescape")


def models_answer(upstream: Upstream, model_id: str | None = None) -> Response:
    """``/v1/models`` (the list) or ``/v1/models/{id}`` (one, or a 404 in OpenAI's shape)."""
    if model_id is None:
        return JSONResponse(model_list(upstream))
    if model_id in model_ids(upstream):
        return JSONResponse(model_entry(model_id))
    message = f"no model {model_id!r} here: this gateway serves {', '.join(model_ids(upstream))}"
    return JSONResponse({"error": {"message": message, "type": "not_found_error", "param": "model",
                                   "code": "model_not_found"}, "type": "error"}, status_code=404)

