"""The server backend over the OpenAI Responses API (a localchat gateway, or any server that speaks
it), through the official ``openai`` SDK: what ``smoke --api responses`` drives. Each turn sends the
whole conversation (``store: false``), as Codex CLI does: the history builder's messages become
input items (calls as ``function_call`` items, results as ``function_call_output``), and the event
stream becomes the same typed events as chat completions'.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from localchat.backends import (
    Event,
    Finished,
    GenerationParams,
    Message,
    ReasoningChunk,
    TextChunk,
    ToolCall,
    ToolCallText,
)
from localchat.backends.http import ServerError
from localchat.backends.openai_http import ServerBackend


class ResponsesBackend(ServerBackend):
    """A ``ServerBackend`` whose turns go to ``/v1/responses``."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        import openai

        self.sdk = openai.OpenAI(base_url=self.url, api_key=self.secret or "none", max_retries=0,
                                 timeout=self.timeout_s)

    def stream(self, messages: list[Message], params: GenerationParams) -> Iterator[Event]:
        import openai

        instructions = "\n\n".join(m["content"] for m in messages if m["role"] == "system") or None
        request: dict[str, Any] = {"model": self.model_field, "input": response_items(messages), "stream": True,
                                   "store": False, "max_output_tokens": params.max_tokens}
        request.update({k: v for k, v in (("instructions", instructions), ("temperature", params.temperature),
                                          ("top_p", params.top_p)) if v is not None})
        if self.tools:
            request["tools"] = [{"type": "function", "name": t["function"]["name"],
                                 "description": t["function"].get("description", ""),
                                 "parameters": t["function"].get("parameters") or {"type": "object"}}
                                for t in self.tools]
        if params.think is not None:
            request["reasoning"] = {"effort": "medium" if params.think else "none"}
        final = None
        try:
            for event in self.sdk.responses.create(**request):
                if event.type == "response.output_text.delta":
                    yield TextChunk(event.delta)
                elif event.type == "response.reasoning_text.delta":
                    yield ReasoningChunk(event.delta)
                elif event.type == "response.output_item.added" and event.item.type == "function_call":
                    yield ToolCallText()
                elif event.type == "response.output_item.done" and event.item.type == "function_call":
                    yield ToolCall(event.item.call_id, event.item.name, event.item.arguments)
                elif event.type in ("response.completed", "response.incomplete", "response.failed"):
                    final = event.response
        except openai.APIStatusError as exc:
            raise ServerError(self.redact(f"HTTP {exc.status_code} from {self.url}/responses: {exc.message}")) from None
        except openai.APIError as exc:
            raise ServerError(self.redact(f"{self.url}/responses: {type(exc).__name__}: {exc}")) from None
        if final is None or final.status == "failed":
            why = final.error.message if final is not None and final.error else "the stream ended before the response"
            raise ServerError(self.redact(f"{self.url}/responses: {why}"))
        usage = final.usage
        calls = any(item.type == "function_call" for item in final.output)
        reason = "length" if final.status == "incomplete" else "tool_calls" if calls else "stop"
        yield Finished(finish_reason=reason, prompt_tokens=usage.input_tokens, completion_tokens=usage.output_tokens,
                       cached_tokens=usage.input_tokens_details.cached_tokens or 0,
                       reasoning_tokens=usage.output_tokens_details.reasoning_tokens or 0)

    def close(self) -> None:
        self.sdk.close()
        super().close()


def response_items(messages: list[Message]) -> list[dict[str, Any]]:
    """The history builder's messages (but the system message, sent as instructions) as input items."""
    items: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        if role in ("user", "assistant") and (message.get("content") or not message.get("tool_calls")):
            items.append({"type": "message", "role": role, "content": message.get("content") or ""})
        for call in message.get("tool_calls") or ():
            arguments = call["function"]["arguments"]
            items.append({"type": "function_call", "call_id": call["id"], "name": call["function"]["name"],
                          "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)})
        if role == "tool":
            items.append({"type": "function_call_output", "call_id": message["tool_call_id"],
                          "output": message["content"]})
    return items
