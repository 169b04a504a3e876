"""A request's body as the gateway reads it: refused (413) past ``MAX_BODY_BYTES`` as it arrives,
whatever Content-Length says; JSON within ``bounded_json``'s limits; text that can travel on."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from localchat import bounded_json
from localchat.serve.request import MAX_BODY_BYTES, ApiError, invalid


def sse(event: dict[str, Any]) -> str:
    """One server-sent event, named by its type (as Anthropic's and the Responses API's streams are)."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


async def raw_body(request: Request) -> bytes:
    """The body, refused (413) past ``MAX_BODY_BYTES`` as it arrives, whatever Content-Length says."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise ApiError(413, "request_too_large", f"the request is {int(declared):,} bytes, over the "
                                                 f"gateway's limit of {MAX_BODY_BYTES:,}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ApiError(413, "request_too_large", f"the request is over the gateway's limit of {MAX_BODY_BYTES:,} "
                                                     "bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def json_body(request: Request) -> Any:
    raw = await raw_body(request)
    try:
        body = bounded_json.loads(raw)
        json.dumps(body, ensure_ascii=False).encode("utf-8")  # a lone surrogate cannot travel on
    except UnicodeError:
        raise invalid("the body holds text that is not valid Unicode (UTF-8, no lone surrogates)") from None
    except ValueError as exc:
        raise invalid(f"the body is not valid JSON: {exc}") from None
    return body
