"""The checks ``smoke --api anthropic|responses`` adds to ``smoke``'s own: a whole (unstreamed)
reply with its usage, and a tool call's round trip, each through the API's official SDK. Streaming,
the two-turn recall and the cache hit go through the same history builder and session as ``chat``,
with the API's backend (``AnthropicBackend``, ``ResponsesBackend``)."""

from __future__ import annotations

from typing import Any

from localchat.backends.anthropic_http import AnthropicBackend
from localchat.backends.openai_http import ServerBackend
from localchat.backends.responses_http import ResponsesBackend

ADD_TOOL = {"name": "add", "description": "Add two integers and return their sum.",
            "schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]}}
QUESTION = "What is 12 plus 30?"


def completion(backend: ServerBackend) -> tuple[bool, str]:
    """One reply, not streamed: its text and its usage."""
    if isinstance(backend, AnthropicBackend):
        reply = backend.sdk.messages.create(model=backend.model_field, max_tokens=32,
                                            messages=[{"role": "user", "content": "Hello"}],
                                            extra_body={"temperature": 0.0})
        text = "".join(b.text for b in reply.content if b.type == "text")
        usage = reply.usage.input_tokens is not None and reply.usage.output_tokens > 0
        return usage and bool(text), f"stop_reason {reply.stop_reason}, {'with' if usage else 'NO'} usage: {text!r}"
    assert isinstance(backend, ResponsesBackend)  # (smoke --api takes anthropic or responses)
    answer = backend.sdk.responses.create(model=backend.model_field, input="Hello", max_output_tokens=32,
                                          temperature=0.0, store=False)
    usage = answer.usage is not None and answer.usage.output_tokens > 0
    return usage and bool(answer.output_text), f"status {answer.status}, {'with' if usage else 'NO'} usage: " \
                                               f"{answer.output_text!r}"


def tool_round_trip(backend: ServerBackend, judge: bool) -> tuple[bool, str]:
    """The model asks for ``add``, hears 42, and answers; only the demo-tools model is judged on
    the numbers. A model whose template takes no tools fails this check (it is not required)."""
    import anthropic
    import openai

    try:
        call, answer = _anthropic_round(backend) if isinstance(backend, AnthropicBackend) else _responses_round(backend)
    except (anthropic.APIStatusError, openai.APIStatusError) as exc:
        return False, f"HTTP {exc.status_code}: {_said(exc.body) or exc.message}"
    if call is None:
        return False, f"no tool call: the model answered {answer!r}"
    good = (call == {"a": 12, "b": 30} and "42" in answer) if judge else bool(answer)
    return good, f"called add({call}), then answered {answer!r}"


def _anthropic_round(backend: AnthropicBackend) -> tuple[dict | None, str]:
    sdk = backend.sdk
    tools: Any = [{"name": ADD_TOOL["name"], "description": ADD_TOOL["description"],
                   "input_schema": ADD_TOOL["schema"]}]
    asked: Any = [{"role": "user", "content": QUESTION}]  # (the SDK's typed params, written as plain JSON)
    first = sdk.messages.create(model=backend.model_field, max_tokens=64, tools=tools, messages=asked,
                                extra_body={"temperature": 0.0})
    use = next((b for b in first.content if b.type == "tool_use"), None)
    if use is None:
        return None, "".join(b.text for b in first.content if b.type == "text")
    asked += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "42"}]}]
    second = sdk.messages.create(model=backend.model_field, max_tokens=64, tools=tools, messages=asked,
                                 extra_body={"temperature": 0.0})
    return dict(use.input), "".join(b.text for b in second.content if b.type == "text")


def _responses_round(backend: ServerBackend) -> tuple[dict | None, str]:
    import json

    assert isinstance(backend, ResponsesBackend)  # (smoke --api takes anthropic or responses)
    sdk = backend.sdk
    tools: Any = [{"type": "function", "name": ADD_TOOL["name"], "description": ADD_TOOL["description"],
                   "parameters": ADD_TOOL["schema"]}]
    first = sdk.responses.create(model=backend.model_field, input=QUESTION, tools=tools, temperature=0.0,
                                 max_output_tokens=64)
    call = next((item for item in first.output if item.type == "function_call"), None)
    if call is None:
        return None, first.output_text
    second = sdk.responses.create(model=backend.model_field, previous_response_id=first.id, tools=tools,
                                  temperature=0.0, max_output_tokens=64,
                                  input=[{"type": "function_call_output", "call_id": call.call_id, "output": "42"}])
    return json.loads(call.arguments or "{}"), second.output_text


def _said(body: Any) -> str | None:
    """The message of an error body in either API's shape."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return error.get("message")
    return body.get("message") if isinstance(body, dict) else None
