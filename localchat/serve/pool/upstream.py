"""The server behind the gateway, reached through the server backend (the one client path): a
request's messages shaped for the model's chat template, its reply as typed events on the one
clock, stop sequences matched, and cancelled when the client goes away.

Each request gets its own HTTP client: closing it is how a request whose client disconnected is
cancelled at once, even in the middle of a long prefill (mlx_lm.server then stops generating).
The model's local tokenizer and template, when it is on this machine, are loaded once and shared;
a request's tools go into a copy of the template, never into the shared one.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from localchat.backends import DEFAULT_TIMEOUT_S, Event, Finished, Message, ReasoningChunk, TextChunk
from localchat.backends.http import make_client, shared_ssl_context
from localchat.backends.openai_http import SERVER_DEFAULT_MODEL, ServerBackend
from localchat.conversation.history import system_first
from localchat.conversation.result import Listeners, StreamOutcome, consume
from localchat.conversation.stats import TurnClock
from localchat.errors import LocalchatError
from localchat.registry import ModelRef, context_length_of, local_tokenizer_loader
from localchat.serve.pool.stops import StopWatch
from localchat.serve.request import ApiError, Ended, GatewayRequest, Idle, invalid
from localchat.templates.render import ChatTemplate, TemplateError, template_of

IDLE_S = 5.0  # a client hears a ping when the server has sent nothing for this long
REASONING_KEY = "_reasoning"  # where a request's past reasoning waits for the template's own field


@dataclass
class Upstream:
    base_url: str  # the server's API root, e.g. http://127.0.0.1:8081/v1
    model_field: str  # the model sent upstream, unless the client names one the server lists
    model_id: str
    api_key: str | None = None
    tokenizer: Any = None  # the model's, when it is on this machine (count_tokens, estimates)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S
    served: frozenset[str] = frozenset()  # the ids the server's /v1/models lists
    idle_s: float = IDLE_S
    named: bool = True  # the gateway was told its model (-m); else it serves whatever the server lists
    context: int | None = None  # the model's window, from its config on this machine
    writes_id: bool = False  # the server names the model by ``model_id`` itself (our engine): replies pass as they are
    template: ChatTemplate | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.template = template_of(self.tokenizer, self.model_id, self.chat_template_kwargs)
        if self.template is not None:
            _ = self.template.traits  # probed once, here: every request's copy shares what it found

    def model_for(self, requested: str) -> str:
        """What the server is asked for: the client's model when the server lists it, else the
        gateway's own (clients name models of their own, e.g. ``claude-sonnet-4-5``), by its id
        when the server lists that (another localchat front: its replies then name it so)."""
        if requested in self.served:
            return requested
        return self.model_id if self.model_id in self.served else self.model_field

    def backend(self, request: GatewayRequest) -> ServerBackend:
        """A backend for one request: its own client, the request's tools, its tool choice."""
        template = copy.copy(self.template) if self.template is not None else None
        extra = {"tool_choice": request.tool_choice} if request.tool_choice is not None and request.tools else {}
        if request.response_format is not None:
            extra["response_format"] = request.response_format
        backend = ServerBackend(make_client(self.base_url, self.api_key, self.timeout_s),
                                self.model_for(request.model), model_id=self.model_id,
                                load_tokenizer=(lambda: self.tokenizer) if self.tokenizer is not None else None,
                                chat_template_kwargs=self.chat_template_kwargs, timeout_s=self.timeout_s,
                                extra_fields=extra, template=template)
        if request.tools:
            try:
                backend.offer_tools(in_stable_order(request.tools))
            except LocalchatError as exc:
                backend.close()
                why = str(exc).split(" (")[0].split(":")[0]  # the template's part, not the CLI's advice
                raise invalid(f"{why}: {self.model_id} cannot call the tools offered; serve a model that calls "
                              "tools (e.g. localchat serve -m demo-tools --api anthropic,responses)", "tools") from None
        return backend

    def shaped(self, request: GatewayRequest) -> list[Message]:
        """The request's messages as the model's template takes them: the system message first (or
        folded into the first user message), the current turn's reasoning in the field the template
        reads. Reasoning of turns before the last user message is left out, as Anthropic's and
        OpenAI's APIs leave it out of the context: a client that sends it back and one that drops it
        get the same prompt, and the same cached prefix."""
        traits = self.template.traits if self.template is not None else None
        field_name = traits.reasoning_field if traits is not None else None
        current = max((i for i, m in enumerate(request.messages) if m.get("role") == "user"), default=0)
        messages = []
        for index, message in enumerate(request.messages):
            reasoning = message.get(REASONING_KEY)
            message = {k: v for k, v in message.items() if k != REASONING_KEY}
            if reasoning and field_name and index > current:
                message[field_name] = reasoning
            messages.append(message)
        return system_first(request.system, messages, bool(traits and traits.fold_system))

    def check_window(self, request: GatewayRequest) -> None:
        """A 400 for a prompt longer than the model's window (the server would answer past it with
        noise). Counted only when it could be: a prompt's tokens are never more than its bytes."""
        if self.context is None or self.template is None:
            return
        size = len(json.dumps([request.system, request.messages, request.tools], ensure_ascii=False).encode())
        if size + 64 * len(request.messages) + 4096 <= self.context:
            return
        tokens = self.count_tokens(request)
        if tokens > self.context:
            raise invalid(f"the prompt is {tokens:,} tokens, over {self.model_id}'s context window of "
                          f"{self.context:,}: shorten it, or serve a model with a longer window", "messages")

    def count_tokens(self, request: GatewayRequest, backend: ServerBackend | None = None) -> int:
        """The prompt's tokens with the model's own template and tokenizer; without them on this
        machine, the server's own count for a 1-token completion (closing ``backend`` from another
        thread cancels that request at once)."""
        backend = backend or self.backend(request)
        messages = self.shaped(request)
        try:
            counted = backend.count_tokens(messages, request.params.think) if backend.template is not None else None
            if counted is not None:
                return counted
            body = backend.request_body(messages, replace(request.params, max_tokens=1), stream=False)
            response = backend.client.post("chat/completions", json=body)
            usage = response.json().get("usage") if response.status_code == 200 else None
            if not isinstance(usage, dict) or not isinstance(usage.get("prompt_tokens"), int):
                raise ApiError(502, "api_error", f"the server behind the gateway could not count the prompt "
                                                 f"(HTTP {response.status_code}) and its tokenizer is not here")
            return usage["prompt_tokens"]
        except TemplateError as exc:
            raise invalid(str(exc)) from None
        except httpx.TimeoutException:
            raise ApiError(504, "api_error", f"the server behind the gateway ({self.base_url}) did not answer within "
                                             f"{self.timeout_s:g}s: the prompt could not be counted") from None
        except httpx.HTTPError as exc:
            raise ApiError(502, "api_error", f"the server behind the gateway ({self.base_url}): "
                                             f"{type(exc).__name__}") from None
        except (LocalchatError, ValueError, OSError) as exc:
            raise ApiError(502, "api_error", f"the server behind the gateway: {exc}") from None
        finally:
            backend.close()

    async def replies(self, request: GatewayRequest, backend: ServerBackend,
                      clock: TurnClock) -> AsyncIterator[Event | Idle | Ended]:
        """The reply's events as they come (``Idle`` when nothing has for ``IDLE_S``), then one
        ``Ended``. The stream runs in a thread; when the consumer stops early (its client went
        away), the request upstream is closed."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event | Ended] = asyncio.Queue()
        cancelled = threading.Event()

        def put(item: Event | Ended) -> None:
            if not cancelled.is_set():
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def work() -> None:
            watch, outcome = StopWatch(request.stop), StreamOutcome()
            listeners = Listeners(on_text=lambda t: put(TextChunk(t)), on_reasoning=lambda t: put(ReasoningChunk(t)),
                                  on_tool_call=put, on_progress=put)
            messages = self.shaped(request)
            events = _until_stopped(backend.stream(messages, request.params), watch, backend, messages, request)
            consume(_unless(events, cancelled), clock, listeners, outcome)
            put(
                Ended(
                    stats=clock.finish(outcome.done),
                    finish_reason=outcome.done.finish_reason if outcome.done else None,
                    stop_sequence=watch.matched,
                    error=None if outcome.done else outcome.error,
                )
            )

        worker = threading.Thread(target=work, name="gateway-upstream", daemon=True)
        worker.start()
        try:
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), self.idle_s)
                except asyncio.TimeoutError:
                    yield Idle()
                    continue
                yield item
                if isinstance(item, Ended):
                    return
        finally:
            cancelled.set()
            backend.close()  # a read in the worker fails at once: the server sees the request go


def in_stable_order(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools by name: a tool list is a set, and a client that reorders it (an agent whose MCP
    servers connect in another order) would otherwise part from its cached prefix at the tools."""
    return sorted(tools, key=lambda tool: str((tool.get("function") or {}).get("name", "")))


def _unless(events: Iterator[Event], cancelled: threading.Event) -> Iterator[Event]:
    try:
        for event in events:
            if cancelled.is_set():
                return
            yield event
    finally:
        close = getattr(events, "close", None)  # (a generator's: the request ends with it)
        if close is not None:
            close()


def _until_stopped(events: Iterator[Event], watch: StopWatch, backend: ServerBackend, messages: list[Message],
                   request: GatewayRequest) -> Iterator[Event]:
    """The answer with the client's stop sequences matched: on a match the upstream request ends
    there, and the counts are the local tokenizer's (the server's own come only at the end)."""
    text = ""
    try:
        for event in events:
            if isinstance(event, TextChunk):
                shown = watch.feed(event.text)
                text += shown
                if shown:
                    yield TextChunk(shown)
                if watch.matched is not None:
                    yield _estimated(backend, messages, request.params.think, text)
                    return
            elif isinstance(event, Finished):
                if rest := watch.flush():
                    yield TextChunk(rest)
                yield event
            else:
                yield event
    finally:
        close = getattr(events, "close", None)  # (a generator's: the request ends with it)
        if close is not None:
            close()


def _estimated(backend: ServerBackend, messages: list[Message], think: bool | None, text: str) -> Finished:
    prompt = backend.count_tokens(messages, think) or 0
    tokenizer = backend.tokenizer
    completion = (
        len(tokenizer.encode(text, add_special_tokens=False)) if tokenizer is not None else max(1, len(text) // 4)
    )
    return Finished(finish_reason="stop", prompt_tokens=prompt, completion_tokens=completion, estimated=True)


def reach_upstream(base_url: str, ref: ModelRef | None, api_key: str | None = None,
                   timeout_s: float = DEFAULT_TIMEOUT_S, tokenizer: bool = True) -> Upstream:
    """The server behind the gateway: what it serves (its /v1/models), the model's tokenizer when
    it is on this machine and wanted (the Anthropic and Responses APIs count and template with it;
    chat completions, passed through, need none). A server that does not answer is one line."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        listed = httpx.get(base_url.rstrip("/") + "/models", headers=headers, timeout=5.0,
                           verify=shared_ssl_context())
        answer = listed.json() if listed.status_code == 200 else {}
        entries = answer.get("data") if isinstance(answer, dict) else []  # (a server may answer anything)
        entries = entries if isinstance(entries, list) else []
    except httpx.HTTPError as exc:
        raise LocalchatError(f"cannot reach the server at {base_url} ({type(exc).__name__}): start one with "
                             "localchat serve, or pass its URL with --upstream") from None
    except ValueError:
        entries = []
    served = frozenset(e["id"] for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str))
    loader = local_tokenizer_loader(ref) if tokenizer else None
    return Upstream(base_url=base_url.rstrip("/"), model_field=ref.location if ref else SERVER_DEFAULT_MODEL,
                    model_id=ref.id if ref else "the server's model", api_key=api_key,
                    tokenizer=loader() if loader else None,
                    chat_template_kwargs=dict(ref.chat_template_kwargs or {}) if ref else {},
                    timeout_s=timeout_s, served=served, named=ref is not None,
                    context=context_length_of(ref) if ref else None)
