"""Server backend: the history builder's messages, POSTed to an OpenAI-compatible server.

Made for ``mlx_lm.server`` and fine with vLLM, llama-server or LM Studio. Token counts come from
the server's ``usage`` (requested with ``stream_options.include_usage``); when a server sends
none, they are counted with the local tokenizer (or, lacking one, from the chunks) and labelled
estimates. Reasoning (``delta.reasoning`` from mlx_lm.server, ``delta.reasoning_content`` from
vLLM, llama-server or DeepSeek) becomes ``ReasoningChunk`` events; no server reports how many
tokens it took, so they are counted with the local tokenizer and labelled an estimate. The API key
is a Bearer header only: validated before any request, never printed, logged or recorded, and cut
out of anything a server sends back.

A turn ends with one line when the server makes no progress for ``timeout_s`` (see ``http``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import httpx

from localchat.backends import (
    DEFAULT_TIMEOUT_S,
    Event,
    Finished,
    GenerationParams,
    Message,
    PrefillProgress,
)
from localchat.backends.http import (
    CONNECT_TIMEOUT_S,
    REDACTED,
    ProgressWatch,
    ServerError,
    describe_http_error,
    error_body,
    iter_lines_watched,
    make_client,
    refusal_hint,
)
from localchat.backends.sse import KeepAlive, StreamError, iter_stream
from localchat.backends.stream_reply import StreamedReply
from localchat.grammar.answer_formats import AnswerFormat
from localchat.registry import ModelRef, context_length_of, local_tokenizer_loader
from localchat.templates.reasoning_formats import ReasoningFormat
from localchat.templates.render import ChatTemplate, TemplateError, check_tool_support, template_of
from localchat.templates.tool_formats import ToolFormat

SERVER_DEFAULT_MODEL = "default_model"  # mlx_lm.server's name for the model it was started with


PREFIX_CACHE_HEADER = "x-localchat-prefix-cache"  # a serve engine's (``serve.engine.cache_breaks``)


def backend_for(base_url: str, ref: ModelRef | None, *, name: str | None = None, api_key: str | None = None,
                load_tokenizer: Callable[[], Any] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                kind: type[ServerBackend] | None = None) -> ServerBackend:
    """A backend for a registry model (sent as the location the server loads, its tokenizer lent
    for estimates when the model is on this machine), or for a bare ``name`` only the server
    knows, or for the server's own model when both are None; ``kind`` speaks another API
    (``AnthropicBackend``, ``ResponsesBackend``)."""
    return (kind or ServerBackend)(
        make_client(base_url, api_key, timeout_s),
        ref.location if ref else (name or SERVER_DEFAULT_MODEL),
        model_id=ref.id if ref else (name or "the server's model"),
        load_tokenizer=load_tokenizer or local_tokenizer_loader(ref),
        chat_template_kwargs=ref.chat_template_kwargs if ref else None,
        known_context=context_length_of(ref) if ref else None,
        timeout_s=timeout_s,
    )


def sampling_fields(params: GenerationParams) -> dict[str, Any]:
    """The samplers beyond temperature and top_p, sent only when set (mlx_lm.server and vLLM read
    them; OpenAI's API does not know them)."""
    fields: dict[str, Any] = {}
    if params.top_k:
        fields["top_k"] = params.top_k
    if params.min_p:
        fields["min_p"] = params.min_p
    if params.repetition_penalty not in (None, 1.0):
        fields["repetition_penalty"] = params.repetition_penalty
    return fields


class ServerBackend:
    name = "server"

    def __init__(self, client: httpx.Client, model_field: str, *, model_id: str | None = None,
                 load_tokenizer: Callable[[], Any] | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None, known_context: int | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, extra_fields: dict[str, Any] | None = None,
                 template: ChatTemplate | None = None):
        self.client = client
        self.extra_fields = dict(extra_fields or {})  # mlx_lm.server's per-request adapter and draft model
        self.model_field = model_field
        self.model_id = model_id or model_field
        self._load_tokenizer = load_tokenizer
        self._tokenizer: Any = None
        self._template: ChatTemplate | bool | None = template  # None: made from the tokenizer on first need
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._context = known_context
        self.timeout_s = timeout_s
        self.image_tokens: Callable[[bytes], int | None] | None = None  # a vision model's processor, when here
        self.tools: list[dict[str, Any]] = []
        self.prefix_cache: str | None = None  # the last reply's ``X-Localchat-Prefix-Cache``, as a serve engine sent it

    @property
    def tokenizer(self) -> Any:
        """The model's local tokenizer, loaded on first need (estimates, context checks)."""
        if self._tokenizer is None and self._load_tokenizer is not None:
            self._tokenizer, self._load_tokenizer = self._load_tokenizer(), None
        return self._tokenizer

    @property
    def template(self) -> ChatTemplate | None:
        """The model's chat template from its local tokenizer (what the server renders too)."""
        if self._template is None and self.tokenizer is not None:
            self._template = template_of(self.tokenizer, self.model_id, self.chat_template_kwargs) or False
        return self._template if isinstance(self._template, ChatTemplate) else None

    def template_kwargs(self, think: bool | None) -> dict[str, Any]:
        """``chat_template_kwargs`` for the server: mapped by the local template when there is one,
        else ``--think/--no-think`` as ``enable_thinking`` (the most common switch)."""
        if self.template is not None:
            return self.template.kwargs(think)
        return self.chat_template_kwargs if think is None else {**self.chat_template_kwargs, "enable_thinking": think}

    @property
    def url(self) -> str:
        return str(self.client.base_url).rstrip("/")

    @property
    def secret(self) -> str:
        return self.client.headers.get("authorization", "").removeprefix("Bearer ")

    def redact(self, text: str) -> str:
        """``text`` with the API key cut out (a server may echo request headers back)."""
        return text.replace(self.secret, REDACTED) if self.secret else text

    def offer_tools(self, tools: list[dict[str, Any]]) -> None:
        """Send these tools with every request; refused in one line when the model's local template
        (if it is on this machine) cannot take them. Without one, the server decides."""
        check_tool_support(self.template, self.model_id)
        self.tools = list(tools)
        if self.template is not None:
            self.template.tools = self.tools

    def prepare_answer(self, fmt: AnswerFormat | None) -> None:
        """A format the grammar library cannot compile is refused before any request (the server may
        not enforce it; the reply is checked here all the same)."""
        from localchat.grammar.compile import check

        if fmt is not None:
            check(fmt, None)

    def request_body(self, messages: list[Message], params: GenerationParams, stream: bool = True) -> dict:
        body: dict[str, Any] = {"model": self.model_field, "messages": wire_messages(messages), "stream": stream,
                                "max_tokens": params.max_tokens}
        body.update({k: v for k, v in (("temperature", params.temperature), ("top_p", params.top_p)) if v is not None})
        if stream:
            body["stream_options"] = {"include_usage": True}
        body.update(sampling_fields(params))
        body.update(self.extra_fields)
        if params.seed is not None:
            body["seed"] = params.seed
        if params.answer is not None:  # response_format (JSON), or vLLM's guided_regex / guided_choice
            body.update(params.answer.request_fields())
        if kwargs := self.template_kwargs(params.think):
            body["chat_template_kwargs"] = kwargs
        if self.tools:
            body["tools"] = self.tools
        if params.think_budget is not None:  # localchat serve's fields (another server ignores them)
            body["think_budget"] = params.think_budget.tokens
            if params.think_budget.message:
                body["think_budget_message"] = params.think_budget.message
        return body

    def count_tokens(self, messages: list[Message], think: bool | None = None) -> int | None:
        return len(self.template.ids(messages, think)) if self.template is not None else None

    def context_length(self) -> int | None:
        """The registry model's own config when it is on this machine; else what the server's
        /v1/models says (vLLM's ``max_model_len``, llama-server's ``meta.n_ctx_train``), once."""
        if self._context is None:
            self._context = self._served_context() or 0
        return self._context or None

    def _served_context(self) -> int | None:
        try:
            response = self.client.get("models", timeout=CONNECT_TIMEOUT_S)
            entries = response.json().get("data") if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict) and entry.get("id") in (self.model_field, self.model_id):
                found = entry.get("meta")
                meta = found if isinstance(found, dict) else {}
                for value in (entry.get("max_model_len"), entry.get("context_length"), meta.get("n_ctx_train")):
                    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                        return value
        return None

    def stream(self, messages: list[Message], params: GenerationParams) -> Iterator[Event]:
        url = f"{self.url}/chat/completions"
        reply = StreamedReply(*self._reasoning_format(messages, params.think), secret=self.secret,
                       tool_format=self._tool_format(), tools=self.tools)
        watch = ProgressWatch(self.timeout_s, url)
        try:
            with self.client.stream("POST", "chat/completions",
                                    json=self.request_body(messages, params)) as response:
                self._check_response(response, url)
                self.prefix_cache = response.headers.get(PREFIX_CACHE_HEADER)
                broke = cache_break_of(self.prefix_cache or "")
                for item in iter_stream(iter_lines_watched(response, watch.check)):
                    if isinstance(item, KeepAlive):
                        if watch.keepalive(item):
                            yield PrefillProgress(item.processed or 0, item.total or 0)
                        continue
                    watch.chunk(item)
                    yield from reply.add(item)
        except httpx.HTTPError as exc:
            raise ServerError(describe_http_error(exc, url, self.timeout_s)) from None
        except StreamError as exc:
            raise StreamError(self.redact(str(exc))) from None
        if reply.finish is None:
            raise StreamError(f"the stream from {url} ended before the reply finished")
        yield from reply.close()
        yield replace(self._finished(reply, messages, params.think), cache_break=broke)

    def _tool_format(self) -> ToolFormat | None:
        """How calls look when a server leaves them in the text (the local template's format; read
        even without tools offered, so that a call is never shown as an answer)."""
        return self.template.traits.tool_format if self.template is not None else None

    def _reasoning_format(self, messages: list[Message], think: bool | None) -> tuple[ReasoningFormat | None, bool]:
        """The model's reasoning format from its local template, and whether this prompt opens a
        reasoning block; (None, False) when there is no local template (the stream may tell)."""
        template = self.template
        fmt = template.traits.reasoning if template is not None else None
        if template is None or fmt is None:
            return None, False
        try:
            return fmt, fmt.opened_by(template.text(messages, think))
        except TemplateError:  # the server may render another template: let it answer for itself
            return fmt, False

    def _check_response(self, response: httpx.Response, url: str) -> None:
        if response.status_code >= 400:
            message = self.redact(error_body(response))
            raise ServerError(
                refusal_hint(message, self.model_id) or f"HTTP {response.status_code} from {url}: {message}"
            )
        kind = response.headers.get("content-type", "")
        if kind.startswith("application/json"):
            raise StreamError(f"{url} answered with one JSON body, not a stream: it does not support "
                              '"stream": true')

    def _finished(self, reply: StreamedReply, messages: list[Message], think: bool | None) -> Finished:
        reasoning = self._count_reasoning(reply)
        if reply.usage:
            return Finished(finish_reason=reply.finish or "stop", prompt_tokens=reply.usage.prompt_tokens,
                            completion_tokens=reply.usage.completion_tokens, cached_tokens=reply.usage.cached_tokens,
                            reasoning_tokens=reasoning, reasoning_estimated=bool(reasoning),
                            reasoning_cut=reply.usage.reasoning_cut)
        prompt = self.count_tokens(messages, think)
        completion = self._count_text(reply.text) + reasoning if self.tokenizer else reply.chunks + reasoning
        return Finished(finish_reason=reply.finish or "stop", prompt_tokens=prompt or 0, completion_tokens=completion,
                        estimated=True, reasoning_tokens=reasoning, reasoning_estimated=bool(reasoning))

    def _count_text(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False)) if text else 0

    def _count_reasoning(self, reply: StreamedReply) -> int:
        """Reasoning tokens as the in-process backend counts them (markers included), from the
        reasoning text and the format's markers; without a tokenizer or a format, the chunks."""
        fmt = reply.inline.format
        if not reply.reasoning:
            return 0
        if self.tokenizer is None or fmt is None:
            return reply.reasoning_chunks
        markers = self._count_text(fmt.close_marker) + (0 if reply.inline.opened else self._count_text(fmt.open_marker))
        return self._count_text(reply.reasoning) + markers

    def close(self) -> None:
        self.client.close()


def cache_break_of(header: str) -> str | None:
    """Where a serve's engine says the prompt broke from its cache (``X-Localchat-Prefix-Cache``:
    ``cached=12; tier=memory; broke-at=12; message=0; role=system``), as the figures line says it."""
    fields = dict(part.strip().partition("=")[::2] for part in header.split(";") if "=" in part)
    at = fields.get("broke-at", "")
    if not at.isdigit():
        return None
    message, role = fields.get("message", ""), fields.get("role", "")[:20]
    return f"message {message} ({role})" if message.isdigit() and role else f"token {at}"


def wire_messages(messages: list[Message]) -> list[Message]:
    """The history builder's messages as the OpenAI API takes them: a tool call's arguments as JSON
    text (the builder keeps them as an object, which is what chat templates render)."""
    def wired(message: Message) -> Message:
        if "tool_calls" not in message:
            return message
        calls = [{**call, "function": {**call["function"], "arguments": json.dumps(call["function"]["arguments"],
                                                                                  ensure_ascii=False)}}
                 for call in message["tool_calls"]]
        return {**message, "tool_calls": calls}

    return [wired(m) for m in messages]
