"""The OpenAI Responses API (``/v1/responses``): a request read into chat messages (the reply is
written back by ``reply``).

Read: ``input`` (a string, or items: messages, ``function_call``, ``function_call_output``,
``reasoning``), ``instructions`` and system or developer messages (one system message: chat templates
take it first), function ``tools`` (others, such as web search, are left out and said in the log),
``tool_choice``, ``reasoning`` (any effort but ``none`` turns thinking on; the effort is a thinking
budget), the samplers, ``max_output_tokens``. With ``store`` (the API's default) a
response is kept in memory (``stored``), for ``previous_response_id`` and to be read back or deleted;
``store: false`` keeps nothing.
"""

from __future__ import annotations

from typing import Any

from localchat import bounded_json
from localchat.backends import GenerationParams, Message
from localchat.serve.apis.responses.stored import ResponseStore
from localchat.serve.pool.upstream import REASONING_KEY
from localchat.serve.request import (
    ApiError,
    GatewayRequest,
    check_results_follow_calls,
    content_of,
    effort_budget,
    function_tool,
    invalid,
    items_of,
    joined_calls,
    picture_part,
    read,
    read_count,
    read_number,
    wire_call_id,
)

TEXT_PARTS = {"input_text", "output_text", "text", "summary_text", "reasoning_text"}


def error_body(error: ApiError) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": error.message, "type": error.kind, "param": error.param,
                      "code": "previous_response_not_found" if error.param == "previous_response_id" else None}}


def read_request(body: Any, store: ResponseStore) -> GatewayRequest:
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    _check_echoed(body)
    instructions = read(body, "instructions", str)
    earlier = store.conversation(previous) if (previous := read(body, "previous_response_id", str)) else []
    systems, messages = _input(body)
    tools, dropped = _tools(body)
    choice, tools = _tool_choice(body.get("tool_choice"), tools)
    effort = read(read(body, "reasoning", dict, default={}), "effort", str, "reasoning")
    params = GenerationParams(
        temperature=read_number(body, "temperature", 0.0, 2.0), top_p=read_number(body, "top_p", 0.0, 1.0),
        max_tokens=read_count(body, "max_output_tokens") or 4096, think=None if effort is None else effort != "none",
        think_budget=effort_budget(effort, "reasoning.effort"))
    conversation = joined_calls([*earlier, *messages])
    check_results_follow_calls(conversation, "function_call_output", "function_call")
    if not conversation or conversation[-1]["role"] == "assistant":
        raise invalid("input: it must end with a user message or a function_call_output", "input")
    system = "\n\n".join(s for s in [instructions, *systems] if s) or None
    return GatewayRequest(model=read(body, "model", str, required=True), system=system, messages=conversation,
                          params=params, stream=bool(read(body, "stream", bool)), tools=tools, tool_choice=choice,
                          dropped_tools=dropped, response_format=_text_format(body))


def _text_format(body: dict[str, Any]) -> dict[str, Any] | None:
    """``text.format`` as chat completions' ``response_format`` (what the server enforces)."""
    fmt = read(read(body, "text", dict, default={}), "format", dict, "text")
    kind = read(fmt, "type", str, "text.format") if fmt else "text"
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = read(fmt, "schema", dict, "text.format", required=True)
        return {"type": "json_schema", "json_schema": {"name": read(fmt, "name", str, "text.format") or "response",
                                                       "schema": schema, "strict": bool(fmt.get("strict"))}}
    raise invalid(f"text.format.type: must be text, json_object or json_schema, not {kind!r}", "text.format.type")


def _check_echoed(body: dict[str, Any]) -> None:
    """The fields a response echoes back, of the types the API gives them (a client's SDK reads
    the echo with its own strict types)."""
    read(body, "store", bool)
    read(body, "parallel_tool_calls", bool)
    metadata = read(body, "metadata", dict, default={})
    if len(metadata) > 16 or not all(isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
                                     for k, v in metadata.items()):
        raise invalid("metadata: at most 16 string values under keys of at most 64 characters", "metadata")


def _input(body: dict[str, Any]) -> tuple[list[str], list[Message]]:
    given = body.get("input")
    if isinstance(given, str):
        return [], [{"role": "user", "content": given}]
    systems: list[str] = []
    messages: list[Message] = []
    reasoning: list[str] = []
    names: dict[str, str] = {}
    for path, item in items_of(body, "input", required=True):
        kind = read(item, "type", str, path, default="message")
        if kind == "message":
            role = read(item, "role", str, path, required=True)
            text = _content(item.get("content"), f"{path}.content", pictures=role == "user")
            if role in ("system", "developer") and isinstance(text, str):  # (no pictures: text)
                systems.append(text)
            elif role in ("user", "assistant"):
                messages.append({"role": role, "content": text, **_reasoned(role, reasoning)})
            else:
                raise invalid(f"{path}.role: must be user, assistant, system or developer, not {role!r}",
                              f"{path}.role")
        elif kind == "function_call":
            messages.append(_call(item, path, names, reasoning))
        elif kind == "function_call_output":
            client_id = read(item, "call_id", str, path, required=True)
            messages.append({"role": "tool", "tool_call_id": wire_call_id(client_id), "name": names.get(client_id, ""),
                             "content": _content(item.get("output"), f"{path}.output"), "_client_id": client_id})
        elif kind == "reasoning":
            parts = [*read(item, "content", list, path, default=[]), *read(item, "summary", list, path, default=[])]
            said = _content(parts, f"{path}.content")
            reasoning.append(said if isinstance(said, str) else "")
        else:
            raise invalid(f"{path}.type: {kind!r} input items are not supported by this gateway", f"{path}.type")
    return systems, messages


def _reasoned(role: str, reasoning: list[str]) -> dict[str, str]:
    """The reasoning items before an assistant message or call, for the template's field."""
    if role != "assistant" or not reasoning:
        return {}
    text = "\n".join(reasoning)
    reasoning.clear()
    return {REASONING_KEY: text}


def _call(item: dict[str, Any], path: str, names: dict[str, str], reasoning: list[str]) -> Message:
    client_id = read(item, "call_id", str, path, required=True)
    name = read(item, "name", str, path, required=True)
    try:
        arguments = bounded_json.loads(read(item, "arguments", str, path, default="") or "{}", strict=True)
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        raise invalid(f"{path}.arguments: must be a JSON object as text", f"{path}.arguments")
    names[client_id] = name
    return {"role": "assistant", "content": "", **_reasoned("assistant", reasoning), "tool_calls": [
        {"id": wire_call_id(client_id), "type": "function", "function": {"name": name, "arguments": arguments}}]}


def _content(content: Any, path: str, pictures: bool = False) -> str | list[dict[str, Any]]:
    """Text parts joined; with ``pictures`` (a user's message), ``input_image`` parts too, as
    OpenAI image parts in their place (a data URL; the gateway fetches no URL, knows no file id)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"{path}: must be a string or a list of content parts", path)
    parts = []
    for i, part in enumerate(content):
        where = f"{path}.{i}"
        kind = read(part, "type", str, where, required=True) if isinstance(part, dict) else None
        if kind in TEXT_PARTS:
            parts.append({"type": "text", "text": read(part, "text", str, where, required=True)})
        elif kind == "refusal":
            parts.append({"type": "text", "text": read(part, "refusal", str, where, required=True)})
        elif kind == "input_image" and pictures:
            url = read(part, "image_url", str, where)
            if not url or not url.startswith("data:"):
                raise invalid(f"{where}: only an image_url holding a data: URL is supported (no file_id, no fetching)",
                              where)
            parts.append(picture_part(url, where))
        else:
            raise invalid(f"{where}: {kind or 'this'} parts are not supported here: the model behind this gateway "
                          "reads text" + (" and pictures of a user's message" if kind == "input_image" else ""), where)
    return content_of(parts, joiner="")


def _tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    tools, dropped = [], []
    for path, tool in items_of(body, "tools"):
        if tool.get("type") != "function":
            dropped.append(str(tool.get("name") or tool.get("type")))
            continue
        tools.append(function_tool(tool.get("name"), tool.get("description"), read(tool, "parameters", dict, path),
                                   path))
    return tools, tuple(dropped)


def _tool_choice(choice: Any, tools: list[dict[str, Any]]) -> tuple[Any, list[dict[str, Any]]]:
    if choice is None or choice in ("auto", "required"):
        return choice, tools
    if choice == "none":
        return None, []
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = read(choice, "name", str, "tool_choice", required=True)
        if name not in {t["function"]["name"] for t in tools}:
            raise invalid(f"tool_choice.name: {name!r} is not one of the tools", "tool_choice.name")
        return {"type": "function", "function": {"name": name}}, tools
    raise invalid("tool_choice: must be auto, none, required or a function", "tool_choice")


# --- the reply -----------------------------------------------------------------------------------------
