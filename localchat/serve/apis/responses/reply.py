"""The Responses API's reply: a response object, or its ``response.*`` event stream, written from
the one client path's typed events (a thinking model's reasoning as a reasoning item, the answer as
a message item, each call as a ``function_call`` item, ``usage`` with cached and reasoning tokens)."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Any

from localchat.backends import Event, Message, ReasoningChunk, TextChunk, ToolCall
from localchat.serve.pool.upstream import REASONING_KEY
from localchat.serve.request import ApiError, Ended, GatewayRequest, arguments_object, wire_call_id


@dataclass
class ResponsesReply:
    """The reply as it streams (``events``), and the response object once it has ended."""

    request: GatewayRequest
    body: dict[str, Any]  # the request as sent (echoed fields: instructions, tools…)
    id: str = field(default_factory=lambda: "resp_" + secrets.token_hex(12))
    created: int = field(default_factory=lambda: int(time.time()))
    items: list[dict[str, Any]] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    sequence: int = 0
    _open: bool = False

    def response(self, status: str, ended: Ended | None = None) -> dict[str, Any]:
        text_format = (self.body.get("text") or {}).get("format") or {"type": "text"}
        out = {"id": self.id, "object": "response", "created_at": self.created, "status": status,
               "model": self.request.model, "output": self.items if ended else [], "error": None,
               "incomplete_details": None, "instructions": self.body.get("instructions"),
               "max_output_tokens": self.body.get("max_output_tokens"),
               "previous_response_id": self.body.get("previous_response_id"),
               "parallel_tool_calls": self.body.get("parallel_tool_calls", True),
               "temperature": self.request.params.temperature, "top_p": self.request.params.top_p,
               "tool_choice": self.body.get("tool_choice", "auto"), "tools": self.body.get("tools", []),
               "store": self.body.get("store", True), "text": {"format": text_format}, "truncation": "disabled",
               "metadata": self.body.get("metadata") or {}, "usage": _usage(ended) if ended else None}
        if ended is not None and ended.error is not None:
            out["error"] = {"code": "server_error", "message": ended.error}
        elif status == "incomplete":
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        return out

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.sequence += 1
        return {"type": kind, "sequence_number": self.sequence - 1, **fields}

    def start(self) -> list[dict[str, Any]]:
        return [self._event("response.created", response=self.response("in_progress")),
                self._event("response.in_progress", response=self.response("in_progress"))]

    def events(self, event: Event) -> list[dict[str, Any]]:
        if isinstance(event, ReasoningChunk):
            return self._delta("reasoning", "reasoning_text", "response.reasoning_text.delta", event.text)
        if isinstance(event, TextChunk):
            return self._delta("message", "output_text", "response.output_text.delta", event.text)
        if isinstance(event, ToolCall):
            return self._call(event)
        return []

    def _delta(self, kind: str, part: str, name: str, text: str) -> list[dict[str, Any]]:
        out = []
        if not (self._open and self.items[-1]["type"] == kind):
            out += self._close()
            prefix = "rs_" if kind == "reasoning" else "msg_"
            item: dict[str, Any] = {"id": prefix + secrets.token_hex(12), "type": kind, "status": "in_progress",
                                    "content": []}
            if kind == "reasoning":
                item["summary"] = []
            else:
                item["role"] = "assistant"
            self.items.append(item)
            self._open = True
            opening = {"type": part, "text": "", **({"annotations": []} if part == "output_text" else {})}
            out += [self._event("response.output_item.added", output_index=len(self.items) - 1,
                                item={**item, "content": []}),
                    self._event("response.content_part.added", item_id=item["id"], output_index=len(self.items) - 1,
                                content_index=0, part=opening)]
            item["content"].append(dict(opening))
        item = self.items[-1]
        item["content"][0]["text"] += text
        extra: dict[str, Any] = {"logprobs": []} if part == "output_text" else {}
        return [*out, self._event(name, item_id=item["id"], output_index=len(self.items) - 1, content_index=0,
                                  delta=text, **extra)]

    def _call(self, call: ToolCall) -> list[dict[str, Any]]:
        out = self._close()
        call = replace(call, arguments=json.dumps(arguments_object(call.arguments), ensure_ascii=False))
        self.calls.append(call)
        item = {"id": "fc_" + call.id, "type": "function_call", "status": "in_progress", "call_id": "call_" + call.id,
                "name": call.name, "arguments": ""}
        index = len(self.items)
        self.items.append({**item, "arguments": call.arguments, "status": "completed"})
        return [*out, self._event("response.output_item.added", output_index=index, item=item),
                self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                            delta=call.arguments),
                self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                            name=call.name, arguments=call.arguments),
                self._event("response.output_item.done", output_index=index, item=self.items[-1])]

    def _close(self) -> list[dict[str, Any]]:
        if not self._open:
            return []
        self._open = False
        item, index = self.items[-1], len(self.items) - 1
        item["status"] = "completed"
        part = item["content"][0]
        done = "response.output_text.done" if part["type"] == "output_text" else "response.reasoning_text.done"
        extra: dict[str, Any] = {"logprobs": []} if part["type"] == "output_text" else {}
        return [self._event(done, item_id=item["id"], output_index=index, content_index=0, text=part["text"], **extra),
                self._event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                            part=part),
                self._event("response.output_item.done", output_index=index, item=item)]

    def end(self, ended: Ended) -> list[dict[str, Any]]:
        status = self._status(ended)
        kind = {"failed": "response.failed", "incomplete": "response.incomplete"}.get(status, "response.completed")
        return [*self._close(), self._event(kind, response=self.response(status, ended))]

    def final(self, ended: Ended) -> dict[str, Any]:
        if ended.error is not None:
            raise ApiError(502, "server_error", ended.error)
        self._close()
        return self.response(self._status(ended), ended)

    @staticmethod
    def _status(ended: Ended) -> str:
        if ended.error is not None:
            return "failed"
        return "incomplete" if ended.finish_reason == "length" else "completed"

    def conversation(self) -> list[Message]:
        """The request's conversation and this reply, as a later ``previous_response_id`` continues it."""
        text = "".join(i["content"][0]["text"] for i in self.items if i["type"] == "message")
        reasoning = "".join(i["content"][0]["text"] for i in self.items if i["type"] == "reasoning")
        answer: Message = {"role": "assistant", "content": text}
        if reasoning:
            answer[REASONING_KEY] = reasoning
        if self.calls:
            answer["tool_calls"] = [{"id": wire_call_id("call_" + c.id), "type": "function",
                                     "function": {"name": c.name, "arguments": arguments_object(c.arguments)}}
                                    for c in self.calls]
        return [*self.request.messages, answer]



def _usage(ended: Ended) -> dict[str, Any]:
    stats = ended.stats
    return {"input_tokens": stats.prompt_tokens,
            "input_tokens_details": {"cached_tokens": stats.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": stats.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": stats.reasoning_tokens},
            "total_tokens": stats.prompt_tokens + stats.completion_tokens}
