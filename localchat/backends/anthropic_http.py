"""The server backend over the Anthropic Messages API (a localchat gateway, or any server that
speaks it), through the official ``anthropic`` SDK: what ``load --api anthropic`` and ``smoke --api
anthropic`` drive. The history builder's messages become Anthropic's (the system message apart,
calls as ``tool_use`` blocks, results as ``tool_result`` blocks); its stream becomes the same typed
events as chat completions', timed on the same clock by whoever consumes them.

The SDK retries nothing here (a load test counts each failure), and its samplers go in the body as
they are: the SDK no longer declares ``temperature``, which the gateway still reads.
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
from localchat.templates.traits import REASONING_FIELDS

STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
                "refusal": "content_filter"}


class AnthropicBackend(ServerBackend):
    """A ``ServerBackend`` (its local tokenizer, template and figures) whose turns go to
    ``/v1/messages``."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        import anthropic

        self.sdk = anthropic.Anthropic(
            base_url=self.url.removesuffix("/v1"), api_key=self.secret or "none", max_retries=0, timeout=self.timeout_s
        )

    def stream(self, messages: list[Message], params: GenerationParams) -> Iterator[Event]:
        import anthropic

        system, turns = anthropic_messages(messages)
        request: dict[str, Any] = {"model": self.model_field, "max_tokens": params.max_tokens, "messages": turns,
                                   "extra_body": _samplers(params)}
        if system:
            request["system"] = system
        if self.tools:
            request["tools"] = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
                                 "input_schema": t["function"].get("parameters") or {"type": "object"}}
                                for t in self.tools]
        if params.think is not None:
            request["thinking"] = {"type": "enabled", "budget_tokens": 1024} if params.think else {"type": "disabled"}
        try:
            with self.sdk.messages.stream(**request) as events:
                yield from self._events(events)
                final = events.get_final_message()
        except anthropic.APIStatusError as exc:
            raise ServerError(
                self.redact(f"HTTP {exc.status_code} from {self.url}/messages: {_message(exc)}")
            ) from None
        except anthropic.APIError as exc:
            raise ServerError(self.redact(f"{self.url}/messages: {type(exc).__name__}: {exc}")) from None
        usage = final.usage
        cached = usage.cache_read_input_tokens or 0
        yield Finished(finish_reason=STOP_REASONS.get(final.stop_reason or "", final.stop_reason or "stop"),
                       prompt_tokens=usage.input_tokens + cached, completion_tokens=usage.output_tokens,
                       cached_tokens=cached)

    @staticmethod
    def _events(events: Any) -> Iterator[Event]:
        for event in events:
            if event.type == "content_block_start" and event.content_block.type == "tool_use":
                yield ToolCallText()
            elif event.type == "content_block_delta" and event.delta.type == "text_delta":
                yield TextChunk(event.delta.text)
            elif event.type == "content_block_delta" and event.delta.type == "thinking_delta":
                yield ReasoningChunk(event.delta.thinking)
            elif event.type == "content_block_stop" and getattr(event.content_block, "type", "") == "tool_use":
                block = event.content_block
                yield ToolCall(block.id, block.name, json.dumps(block.input, ensure_ascii=False))

    def close(self) -> None:
        self.sdk.close()
        super().close()


def _samplers(params: GenerationParams) -> dict[str, Any]:
    fields = {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k or None}
    return {k: v for k, v in fields.items() if v is not None}


def _message(exc: Any) -> str:
    body = exc.body if isinstance(exc.body, dict) else {}
    found = body.get("error")
    error = found if isinstance(found, dict) else {}
    return str(error.get("message") or exc.message)


def anthropic_messages(messages: list[Message]) -> tuple[str | None, list[dict[str, Any]]]:
    """The history builder's messages as Anthropic's: the system message apart, each assistant
    message's reasoning, text and calls as blocks, tool results as one user message of blocks."""
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system") or None
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        if role == "user":
            out.append({"role": "user", "content": message["content"]})
        elif role == "assistant":
            out.append({"role": "assistant", "content": _assistant_blocks(message)})
        elif role == "tool":
            result = {"type": "tool_result", "tool_use_id": message["tool_call_id"], "content": message["content"]}
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(result)
            else:
                out.append({"role": "user", "content": [result]})
    return system, out


def _assistant_blocks(message: Message) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    reasoning = next((message[f] for f in REASONING_FIELDS if message.get(f)), None)
    if reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        arguments = call["function"]["arguments"]
        blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                       "input": arguments if isinstance(arguments, dict) else json.loads(arguments or "{}")})
    return blocks or [{"type": "text", "text": ""}]
