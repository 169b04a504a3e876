"""MCP tools as localchat's tools: their names and entries for the model, their results as text.

A tool is offered as ``SERVER_TOOL``, reduced to ``[A-Za-z0-9_-]{1,64}`` (what OpenAI-style APIs
accept). Its input schema passes through when it is a valid object schema; its description is
capped. A result's text blocks are joined; ``structuredContent`` is JSON text when there is no text;
an image, audio or resource is one placeholder line with its type and size (the model reads text);
``isError`` makes it an error result. The output cap is the Python tools' own.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

from localchat.tools.worker import capped

NAME_LIMIT = 64
INVALID = re.compile(r"[^A-Za-z0-9_-]")
MAX_DESCRIPTION = 1000


def exposed_name(server: str, tool: str) -> str:
    """``SERVER_TOOL`` in the characters every API takes, at most 64 of them."""
    name = INVALID.sub("_", f"{server}_{tool}")
    return name[:NAME_LIMIT]


def tool_entry(name: str, tool: Any) -> dict[str, Any] | str:
    """The OpenAI ``tools`` entry for an MCP tool offered as ``name``, or why it cannot be offered."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    schema = tool.input_schema
    if not isinstance(schema, dict) or schema.get("type") != "object":
        kind = schema.get("type") if isinstance(schema, dict) else type(schema).__name__
        return f"its input schema is not an object schema (type {kind!r})"
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return f"its input schema is invalid ({exc.message[:120]})"
    except RecursionError:
        return "its input schema is nested too deep"
    description = " ".join((tool.description or tool.title or tool.name).split())
    if len(description) > MAX_DESCRIPTION:
        description = description[:MAX_DESCRIPTION - 1] + "…"
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


def result_text(result: Any) -> tuple[bool, str]:
    """(ok, text) of a ``CallToolResult``: what the model reads, capped."""
    parts = [_block(block) for block in result.content or []]
    text = "\n".join(p for p in parts if p)
    if not any(getattr(b, "type", None) == "text" for b in result.content or []) and \
            result.structured_content is not None:
        text = "\n".join(filter(None, [json.dumps(result.structured_content, ensure_ascii=False), text]))
    return not result.is_error, capped(text or "(the tool returned nothing)")


def _block(block: Any) -> str:
    kind = getattr(block, "type", None)
    if kind == "text":
        return block.text
    if kind in ("image", "audio"):
        return f"[{kind}: {block.mime_type}, {_size(block.data):,} bytes; not shown to the model, which reads text]"
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        if text is not None:
            return f"[resource {resource.uri}]\n{text}"
        return f"[resource {resource.uri}: {resource.mime_type or 'binary'}, {_size(resource.blob):,} bytes; not shown]"
    if kind == "resource_link":
        return f"[resource link: {block.uri}" + (f" ({block.mime_type})" if block.mime_type else "") + "]"
    return f"[{kind or 'unknown'} content; not shown]"


def _size(data: str) -> int:
    """Bytes of base64 ``data`` (estimated from its length when it does not decode)."""
    try:
        return len(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError, TypeError):
        return len(data or "") * 3 // 4
