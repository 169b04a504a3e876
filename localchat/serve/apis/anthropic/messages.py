"""The Anthropic Messages API (``/v1/messages``, ``/v1/messages/count_tokens``): a request read
into chat messages, and the reply written back as Anthropic's message or its event stream.

Read: ``system`` (a string or text blocks), messages of text (a system message among them, as
Claude Code sends its reminders, is read as the user's text where it stands: a chat template takes
one system message, first, and moving it there would lose the server's prompt cache), ``tool_use``, ``tool_result`` and
``thinking`` blocks, ``image`` blocks with base64 data (checked, sent as OpenAI image parts: the
model must see; a document is refused), the samplers,
``stop_sequences``, ``tools`` with ``input_schema`` and ``tool_choice``, ``thinking`` (its ``budget_tokens``
bounds the reasoning: ``grammar.think_budget``). Tools of
Anthropic's own kinds (web search, a computer) are left out, said in the gateway's log. Written:
``thinking``, ``text`` and ``tool_use`` blocks, ``stop_reason`` and ``usage``, where
``input_tokens`` counts what was not read from the server's prompt cache, as Anthropic's does.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from localchat.backends import Event, GenerationParams, Message, PrefillProgress, ReasoningChunk, TextChunk, ToolCall
from localchat.grammar.think_budget import MAX_BUDGET, ThinkBudget
from localchat.serve.pool.upstream import REASONING_KEY
from localchat.serve.request import (
    ApiError,
    Ended,
    GatewayRequest,
    arguments_object,
    check_results_follow_calls,
    content_of,
    function_tool,
    invalid,
    items_of,
    joined_calls,
    joined_content,
    picture_part,
    read,
    read_count,
    read_number,
    wire_call_id,
)

MAX_STOP_SEQUENCES = 16
NOT_TEXT = {"document", "search_result", "container_upload"}
STATUS_KINDS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}


def error_body(error: ApiError) -> dict[str, Any]:
    """Anthropic's error shape: ``{"type": "error", "error": {"type": …, "message": …}}``."""
    kind = error.kind if error.kind != "invalid_request_error" else STATUS_KINDS.get(error.status, error.kind)
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def read_request(body: Any, *, counting: bool = False) -> GatewayRequest:
    """A Messages (or count_tokens) request, checked; ``max_tokens`` is required to create one."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    thinking = read(body, "thinking", dict, default={})
    stops = read(body, "stop_sequences", list, default=[])
    if len(stops) > MAX_STOP_SEQUENCES or not all(isinstance(s, str) and s for s in stops):
        raise invalid(f"stop_sequences: at most {MAX_STOP_SEQUENCES} non-empty strings", "stop_sequences")
    tools, dropped = _tools(body)
    choice, tools = _tool_choice(read(body, "tool_choice", dict), tools)
    params = GenerationParams(
        temperature=read_number(body, "temperature", 0.0, 1.0), top_p=read_number(body, "top_p", 0.0, 1.0),
        top_k=read_count(body, "top_k", low=0) or 0,
        max_tokens=read_count(body, "max_tokens", required=not counting) or 1,
        think={"enabled": True, "adaptive": True, "between_tools": True, "disabled": False}.get(
            read(thinking, "type", str, "thinking")),
        think_budget=_budget(thinking))
    return GatewayRequest(model=read(body, "model", str, required=True), system=_system(body.get("system")),
                          messages=_messages(body), params=params, stream=bool(read(body, "stream", bool)),
                          tools=tools, tool_choice=choice, stop=tuple(stops), dropped_tools=dropped)


def _budget(thinking: dict[str, Any]) -> ThinkBudget | None:
    """``thinking.budget_tokens`` of enabled thinking: the reasoning's tokens at most (any whole number
    from 0: a local model is no API with a 1,024 floor)."""
    if read(thinking, "type", str, "thinking") != "enabled":
        return None
    tokens = read_count(thinking, "budget_tokens", "thinking", low=0)
    if tokens is not None and tokens > MAX_BUDGET:
        raise invalid(f"thinking.budget_tokens: at most {MAX_BUDGET:,}", "thinking.budget_tokens")
    return ThinkBudget(tokens=tokens) if tokens is not None else None


def _system(system: Any) -> str | None:
    if system is None or isinstance(system, str):
        return system or None
    if not isinstance(system, list):
        raise invalid("system: must be a string or a list of text blocks", "system")
    return "\n\n".join(_text_block(block, f"system.{i}") for i, block in enumerate(system)) or None


def _text_block(block: Any, path: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text":
        raise invalid(f"{path}: must be a text block", path)
    return read(block, "text", str, path, required=True)


def _messages(body: dict[str, Any]) -> list[Message]:
    out: list[Message] = []
    names: dict[str, str] = {}  # a tool_use's id → its tool, for the result's message
    pairs = items_of(body, "messages", required=True)
    if not pairs:
        raise invalid("messages: at least one message is required", "messages")
    for path, message in pairs:
        role = read(message, "role", str, path, required=True)
        if role not in ("user", "assistant", "system"):
            raise invalid(f"{path}.role: must be 'user', 'assistant' or 'system', not {role!r}", f"{path}.role")
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise invalid(f"{path}.content: must be a string or a list of content blocks", f"{path}.content")
        if role == "system":  # Claude Code's reminders: user text where they stand (the cached prefix stays)
            out.append({"role": "user", "content": "\n\n".join(_text_block(b, f"{path}.content.{i}")
                                                                for i, b in enumerate(blocks))})
        else:
            out.extend(_user(blocks, path, names) if role == "user" else _assistant(blocks, path, names))
    if out[-1]["role"] == "assistant":
        raise invalid("the last message must be the user's: continuing an assistant's message is not supported "
                      "by this gateway", "messages")
    check_results_follow_calls(out, "tool_result", "tool_use")
    return _joined_users(joined_calls(out))


def _user(blocks: list[Any], path: str, names: dict[str, str]) -> list[Message]:
    results, parts = [], []
    for i, block in enumerate(blocks):
        where, kind = f"{path}.content.{i}", _kind(block, f"{path}.content.{i}")
        if kind == "text":
            parts.append({"type": "text", "text": _text_block(block, where)})
        elif kind == "image":
            parts.append(_image(block, where))
        elif kind == "tool_result":
            results.append(_tool_result(block, where, names))
        elif kind in NOT_TEXT:
            raise invalid(f"{where}: {kind} blocks are not supported: the model behind this gateway reads text", where)
        else:
            raise invalid(f"{where}.type: {kind!r} is not a content block a user message takes here", f"{where}.type")
    return [*results, *([{"role": "user", "content": content_of(parts)}] if parts else [])]


def _image(block: dict[str, Any], where: str) -> dict[str, Any]:
    """An image block with base64 data, as the OpenAI part the backend sends (a URL source is
    refused: the gateway fetches nothing)."""
    source = read(block, "source", dict, where, required=True)
    if source.get("type") != "base64":
        raise invalid(f"{where}.source: only base64 image sources are supported (the gateway fetches no URL)",
                      f"{where}.source")
    import base64
    import binascii

    try:
        data = base64.b64decode(read(source, "data", str, f"{where}.source", required=True), validate=True)
    except (binascii.Error, ValueError):
        raise invalid(f"{where}.source.data: not valid base64", f"{where}.source.data") from None
    return picture_part(data, where)


def _tool_result(block: dict[str, Any], where: str, names: dict[str, str]) -> Message:
    client_id = read(block, "tool_use_id", str, where, required=True)
    content = block.get("content", "")
    if isinstance(content, list):
        kinds = {_kind(b, f"{where}.content.{j}") for j, b in enumerate(content)}
        if kinds & NOT_TEXT:
            raise invalid(f"{where}.content: image blocks in a tool result are not supported: the model reads text",
                          f"{where}.content")
        content = "\n".join(_text_block(b, f"{where}.content.{j}") for j, b in enumerate(content))
    elif not isinstance(content, str):
        raise invalid(f"{where}.content: must be a string or a list of text blocks", f"{where}.content")
    if read(block, "is_error", bool, where):
        content = f"Error: {content}"
    return {"role": "tool", "tool_call_id": wire_call_id(client_id), "name": names.get(client_id, ""),
            "content": content, "_client_id": client_id}


def _assistant(blocks: list[Any], path: str, names: dict[str, str]) -> list[Message]:
    message: Message = {"role": "assistant", "content": ""}
    calls, reasoning = [], []
    for i, block in enumerate(blocks):
        where, kind = f"{path}.content.{i}", _kind(block, f"{path}.content.{i}")
        if kind == "text":
            message["content"] += _text_block(block, where)
        elif kind == "tool_use":
            client_id = read(block, "id", str, where, required=True)
            name = read(block, "name", str, where, required=True)
            names[client_id] = name
            calls.append({"id": wire_call_id(client_id), "type": "function",
                          "function": {"name": name, "arguments": read(block, "input", dict, where, default={})}})
        elif kind == "thinking":
            reasoning.append(read(block, "thinking", str, where, required=True))
        elif kind != "redacted_thinking":
            raise invalid(f"{where}.type: {kind!r} is not a content block an assistant message takes here",
                          f"{where}.type")
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message[REASONING_KEY] = "\n".join(reasoning)
    return [message]


def _kind(block: Any, where: str) -> str:
    if not isinstance(block, dict):
        raise invalid(f"{where}: must be a content block (an object)", where)
    return read(block, "type", str, where, required=True)


def _joined_users(messages: list[Message]) -> list[Message]:
    """Two user messages in a row are one (as Anthropic reads them; some templates demand turns
    that alternate)."""
    out: list[Message] = []
    for message in messages:
        if out and out[-1]["role"] == message["role"] == "user":
            out[-1] = {**out[-1], "content": joined_content(out[-1]["content"], message["content"])}
        else:
            out.append(message)
    return out


def _tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    tools, dropped = [], []
    for path, tool in items_of(body, "tools"):
        kind = tool.get("type")
        if kind not in (None, "custom"):
            dropped.append(str(tool.get("name") or kind))
            continue
        tools.append(function_tool(tool.get("name"), tool.get("description"),
                                   read(tool, "input_schema", dict, path, required=True), path))
    return tools, tuple(dropped)


def _tool_choice(choice: dict[str, Any] | None, tools: list[dict[str, Any]]) -> tuple[Any, list[dict[str, Any]]]:
    """Anthropic's tool_choice in OpenAI's form; ``none`` offers no tools at all."""
    if choice is None:
        return None, tools
    kind = read(choice, "type", str, "tool_choice", required=True)
    if kind == "none":
        return None, []
    if kind == "auto":
        return "auto", tools
    if kind == "any":
        return "required", tools
    if kind == "tool":
        name = read(choice, "name", str, "tool_choice", required=True)
        if name not in {t["function"]["name"] for t in tools}:
            raise invalid(f"tool_choice.name: {name!r} is not one of the tools", "tool_choice.name")
        return {"type": "function", "function": {"name": name}}, tools
    raise invalid(f"tool_choice.type: must be auto, any, tool or none, not {kind!r}", "tool_choice.type")


# --- the reply -----------------------------------------------------------------------------------------

@dataclass
class MessagesReply:
    """The reply as it streams: ``events`` for each upstream event, ``message`` once it has ended."""

    model: str
    input_estimate: int = 0  # the prompt's tokens as counted here (the server's count comes at the end)
    id: str = field(default_factory=lambda: "msg_" + secrets.token_hex(12))
    blocks: list[dict[str, Any]] = field(default_factory=list)
    _open: bool = False

    def start(self) -> list[dict[str, Any]]:
        message = {**self._shell(), "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": self.input_estimate, "output_tokens": 0}}
        return [{"type": "message_start", "message": message}]

    def _shell(self) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model}

    def events(self, event: Event) -> list[dict[str, Any]]:
        if isinstance(event, PrefillProgress):
            return [{"type": "ping"}]
        if isinstance(event, ReasoningChunk):
            return self._delta("thinking", {"type": "thinking_delta", "thinking": event.text},
                               {"type": "thinking", "thinking": "", "signature": ""}, event.text)
        if isinstance(event, TextChunk):
            return self._delta("text", {"type": "text_delta", "text": event.text}, {"type": "text", "text": ""},
                               event.text)
        if isinstance(event, ToolCall):
            return self._call(event)
        return []

    def _delta(self, kind: str, delta: dict[str, Any], opening: dict[str, Any], text: str) -> list[dict[str, Any]]:
        out = []
        if not (self._open and self.blocks[-1]["type"] == kind):
            out += self._close()
            self.blocks.append(dict(opening))
            self._open = True
            out.append({"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": opening})
        self.blocks[-1][kind] += text
        return [*out, {"type": "content_block_delta", "index": len(self.blocks) - 1, "delta": delta}]

    def _call(self, call: ToolCall) -> list[dict[str, Any]]:
        arguments = arguments_object(call.arguments)
        block = {"type": "tool_use", "id": "toolu_" + call.id, "name": call.name, "input": {}}
        out = self._close()
        self.blocks.append({**block, "input": arguments})
        index = len(self.blocks) - 1
        return [*out, {"type": "content_block_start", "index": index, "content_block": block},
                {"type": "content_block_delta", "index": index,
                 "delta": {"type": "input_json_delta", "partial_json": json.dumps(arguments, ensure_ascii=False)}},
                {"type": "content_block_stop", "index": index}]

    def _close(self) -> list[dict[str, Any]]:
        if not self._open:
            return []
        self._open = False
        return [{"type": "content_block_stop", "index": len(self.blocks) - 1}]

    def end(self, ended: Ended) -> list[dict[str, Any]]:
        if ended.error is not None:
            return [{"type": "error", "error": {"type": "api_error", "message": ended.error}}]
        return [*self._close(), {"type": "message_delta", "delta": {"stop_reason": self._stop_reason(ended),
                                                                    "stop_sequence": ended.stop_sequence},
                                 "usage": self._usage(ended)}, {"type": "message_stop"}]

    def message(self, ended: Ended) -> dict[str, Any]:
        if ended.error is not None:
            raise ApiError(502, "api_error", ended.error)
        return {**self._shell(), "content": self.blocks, "stop_reason": self._stop_reason(ended),
                "stop_sequence": ended.stop_sequence, "usage": self._usage(ended)}

    def _stop_reason(self, ended: Ended) -> str:
        if ended.stop_sequence is not None:
            return "stop_sequence"
        if any(b["type"] == "tool_use" for b in self.blocks):
            return "tool_use"
        return "max_tokens" if ended.finish_reason == "length" else "end_turn"

    @staticmethod
    def _usage(ended: Ended) -> dict[str, int]:
        stats = ended.stats
        return {"input_tokens": stats.prompt_tokens - stats.cached_tokens, "output_tokens": stats.completion_tokens,
                "cache_read_input_tokens": stats.cached_tokens, "cache_creation_input_tokens": 0}

