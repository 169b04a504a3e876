"""Server backend: the history builder's messages, POSTed to an OpenAI-compatible server.

Made for ``mlx_lm.server`` and fine with vLLM, llama-server or LM Studio. Token counts come from
the server's ``usage`` (requested with ``stream_options.include_usage``); when a server sends
none, they are counted with the local tokenizer (or, lacking one, from the chunks) and labelled
estimates. Reasoning (``delta.reasoning`` from mlx_lm.server, ``delta.reasoning_content`` from
vLLM, llama-server or DeepSeek) becomes ``ReasoningChunk`` events; no server reports how many
tokens it took, so they are counted with the local tokenizer and labelled an estimate. The API key is a Bearer header only: validated before any request, never printed,
logged or recorded, and cut out of anything a server sends back.

A turn ends with one line when the server makes no progress for ``timeout_s``: no bytes at all
(httpx's read timeout), or only comments whose prefill count does not advance.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from localchat.backends import (
    DEFAULT_TIMEOUT_S,
    Event,
    Finished,
    GenerationParams,
    Message,
    Progress,
    ReasoningChunk,
    TextChunk,
    chat_template_ids,
    template_kwargs,
)
from localchat.backends.sse import ChatChunk, KeepAlive, StreamError, Usage, error_message, iter_stream
from localchat.errors import LocalchatError, UsageError
from localchat.registry import ModelRef, context_length_of, local_tokenizer_loader

CONNECT_TIMEOUT_S = 5.0
SERVER_DEFAULT_MODEL = "default_model"  # mlx_lm.server's name for the model it was started with
MAX_LINE_CHARS = 16 * 1024 * 1024  # a "line" longer than this is not a chat-completion stream
REDACTED = "[api key]"


class ServerError(LocalchatError):
    pass


def check_api_key(api_key: str | None) -> str | None:
    """A key that can travel in an HTTP header: printable ASCII, no spaces (never echoed)."""
    if api_key is not None and (not api_key or any(not 0x21 <= ord(c) <= 0x7E for c in api_key)):
        raise UsageError("the API key must be printable ASCII with no spaces or line breaks "
                         "(it is not shown here); check --api-key / LOCALCHAT_API_KEY")
    return api_key


def make_client(base_url: str, api_key: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                transport: httpx.BaseTransport | None = None) -> httpx.Client:
    """One pooled client for the whole session (connections are reused across turns);
    ``transport`` is for tests (``httpx.MockTransport``)."""
    headers = {"Authorization": f"Bearer {check_api_key(api_key)}"} if api_key else {}
    timeout = httpx.Timeout(connect=CONNECT_TIMEOUT_S, read=timeout_s, write=30.0, pool=CONNECT_TIMEOUT_S)
    return httpx.Client(base_url=base_url.rstrip("/") + "/", headers=headers, timeout=timeout,
                        transport=transport)


def backend_for(base_url: str, ref: ModelRef | None, *, name: str | None = None, api_key: str | None = None,
                load_tokenizer: Callable[[], Any] | None = None,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> ServerBackend:
    """A backend for a registry model (sent as the location the server loads, its tokenizer lent
    for estimates when the model is on this machine), or for a bare ``name`` only the server
    knows, or for the server's own model when both are None."""
    return ServerBackend(
        make_client(base_url, api_key, timeout_s),
        ref.location if ref else (name or SERVER_DEFAULT_MODEL),
        model_id=ref.id if ref else (name or "the server's model"),
        load_tokenizer=load_tokenizer or local_tokenizer_loader(ref),
        chat_template_kwargs=ref.chat_template_kwargs if ref else None,
        known_context=context_length_of(ref) if ref else None,
        timeout_s=timeout_s,
    )


def describe_http_error(exc: httpx.HTTPError, url: str, timeout_s: float | None = None) -> str:
    if isinstance(exc, httpx.ConnectTimeout):
        return f"cannot connect to {url}: no answer within {CONNECT_TIMEOUT_S:.0f}s (is the host right?)"
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect to {url}: nothing is listening there. Start a server with: localchat serve"
    if isinstance(exc, httpx.TimeoutException):
        limit = f" for {timeout_s:.0f}s" if timeout_s else ""
        return f"{url} sent nothing{limit} ({type(exc).__name__}); raise --timeout for very long prompts"
    if isinstance(exc, httpx.RemoteProtocolError):
        return f"{url} closed the connection without a complete response ({exc})"
    return f"HTTP failure talking to {url}: {type(exc).__name__}"


def iter_lines_watched(response: httpx.Response, deadline: Callable[[], None]) -> Iterator[str]:
    """The response's lines; ``deadline`` is checked whenever bytes arrive, so a server that
    trickles bytes with no newline cannot hold the turn forever, nor fill memory."""
    pending = ""
    for text in response.iter_text():
        deadline()
        pending += text
        *lines, pending = pending.split("\n")
        yield from lines
        if len(pending) > MAX_LINE_CHARS:
            raise StreamError(f"the server sent over {MAX_LINE_CHARS // 2**20} MiB without a line break")
    if pending:
        yield pending


class ServerBackend:
    name = "server"

    def __init__(self, client: httpx.Client, model_field: str, *, model_id: str | None = None,
                 load_tokenizer: Callable[[], Any] | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None, known_context: int | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        self.client = client
        self.model_field = model_field
        self.model_id = model_id or model_field
        self._load_tokenizer = load_tokenizer
        self._tokenizer: Any = None
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._context = known_context
        self.timeout_s = timeout_s

    @property
    def tokenizer(self) -> Any:
        """The model's local tokenizer, loaded on first need (estimates, context checks)."""
        if self._tokenizer is None and self._load_tokenizer is not None:
            self._tokenizer, self._load_tokenizer = self._load_tokenizer(), None
        return self._tokenizer

    @property
    def url(self) -> str:
        return str(self.client.base_url).rstrip("/")

    def redact(self, text: str) -> str:
        """``text`` with the API key cut out (a server may echo request headers back)."""
        secret = self.client.headers.get("authorization", "").removeprefix("Bearer ")
        return text.replace(secret, REDACTED) if secret else text

    def request_body(self, messages: list[Message], params: GenerationParams, stream: bool = True) -> dict:
        body: dict[str, Any] = {
            "model": self.model_field, "messages": messages, "stream": stream,
            "temperature": params.temperature, "top_p": params.top_p, "max_tokens": params.max_tokens,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        if params.seed is not None:
            body["seed"] = params.seed
        if params.response_format is not None:
            body["response_format"] = params.response_format
        if kwargs := template_kwargs(self.chat_template_kwargs, params.think):
            body["chat_template_kwargs"] = kwargs
        return body

    def count_tokens(self, messages: list[Message], think: bool | None = None) -> int | None:
        if self.tokenizer is None:
            return None
        return len(chat_template_ids(self.tokenizer, messages, template_kwargs(self.chat_template_kwargs, think)))

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
                meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
                for value in (entry.get("max_model_len"), entry.get("context_length"), meta.get("n_ctx_train")):
                    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                        return value
        return None

    def stream(self, messages: list[Message], params: GenerationParams) -> Iterator[Event]:
        url = f"{self.url}/chat/completions"
        reply = _Reply()
        watch = _ProgressWatch(self.timeout_s, url)
        try:
            with self.client.stream("POST", "chat/completions",
                                    json=self.request_body(messages, params)) as response:
                self._check_response(response, url)
                for item in iter_stream(iter_lines_watched(response, watch.check)):
                    if isinstance(item, KeepAlive):
                        if watch.keepalive(item):
                            yield Progress(item.processed, item.total)
                        continue
                    watch.chunk(item)
                    yield from reply.add(item, self.redact)
        except httpx.HTTPError as exc:
            raise ServerError(describe_http_error(exc, url, self.timeout_s)) from None
        except StreamError as exc:
            raise StreamError(self.redact(str(exc))) from None
        if reply.finish is None:
            raise StreamError(f"the stream from {url} ended before the reply finished")
        yield self._finished(reply, messages, params.think)

    def _check_response(self, response: httpx.Response, url: str) -> None:
        if response.status_code >= 400:
            raise ServerError(f"HTTP {response.status_code} from {url}: {self.redact(_error_body(response))}")
        kind = response.headers.get("content-type", "")
        if kind.startswith("application/json"):
            raise StreamError(f"{url} answered with one JSON body, not a stream: it does not support "
                              '"stream": true')

    def _finished(self, reply: _Reply, messages: list[Message], think: bool | None) -> Finished:
        reasoning = self._count_reasoning(reply, messages, think)
        if reply.usage:
            return Finished(finish_reason=reply.finish, prompt_tokens=reply.usage.prompt_tokens,
                            completion_tokens=reply.usage.completion_tokens, cached_tokens=reply.usage.cached_tokens,
                            reasoning_tokens=reasoning, reasoning_estimated=bool(reasoning))
        prompt = self.count_tokens(messages, think)
        completion = self._count_text(reply.text) + reasoning if self.tokenizer else reply.chunks + reasoning
        return Finished(finish_reason=reply.finish, prompt_tokens=prompt or 0, completion_tokens=completion,
                        estimated=True, reasoning_tokens=reasoning, reasoning_estimated=bool(reasoning))

    def _count_text(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False)) if text else 0

    def _count_reasoning(self, reply: _Reply, messages: list[Message], think: bool | None) -> int:
        """Reasoning tokens as the in-process backend counts them (markers included), from the
        reasoning text and the local tokenizer's think markers; without a tokenizer, the chunks."""
        tokenizer, reasoning = self.tokenizer, reply.reasoning
        if not reasoning:
            return 0
        if tokenizer is None or not getattr(tokenizer, "has_thinking", False):
            return reply.reasoning_chunks
        from localchat.backends.reasoning import opens_reasoning

        markers = self._count_text(tokenizer.think_end)
        prompt_ids = chat_template_ids(tokenizer, messages, template_kwargs(self.chat_template_kwargs, think))
        if not opens_reasoning(tokenizer, prompt_ids):
            markers += self._count_text(tokenizer.think_start)
        return self._count_text(reasoning) + markers

    def close(self) -> None:
        self.client.close()


class _Reply:
    """What a stream has said so far: the answer, the reasoning, the last figures."""

    def __init__(self) -> None:
        self.text = self.reasoning = ""
        self.finish: str | None = None
        self.usage: Usage | None = None
        self.chunks = self.reasoning_chunks = 0

    def add(self, item: ChatChunk, redact: Callable[[str], str]) -> Iterator[Event]:
        self.usage = item.usage or self.usage
        self.finish = item.finish_reason or self.finish
        if item.reasoning:
            text = redact(item.reasoning)
            self.reasoning += text
            self.reasoning_chunks += 1
            yield ReasoningChunk(text)
        if item.content:
            text = redact(item.content)
            self.text += text
            self.chunks += 1
            yield TextChunk(text)


class _ProgressWatch:
    """When the stream last made progress: a chunk with text or figures, or a keepalive whose
    prefill count advanced. Nothing else resets the no-progress timeout."""

    def __init__(self, timeout_s: float, url: str):
        self.timeout_s, self.url = timeout_s, url
        self.last = time.monotonic()
        self.processed = -1

    def check(self) -> None:
        if time.monotonic() - self.last > self.timeout_s:
            raise ServerError(f"{self.url} made no progress for {self.timeout_s:.0f}s (only keepalive "
                              "comments that did not advance); raise --timeout for very long prompts")

    def keepalive(self, item: KeepAlive) -> bool:
        """True (and progress) when the prefill count advanced."""
        if item.processed is None or item.total is None or item.processed <= self.processed:
            return False
        self.processed, self.last = item.processed, time.monotonic()
        return True

    def chunk(self, item: ChatChunk) -> None:
        if item.content or item.reasoning or item.finish_reason or item.usage:
            self.last = time.monotonic()


def _error_body(response: httpx.Response) -> str:
    """The human part of an error response: its ``error`` message, or its first line of text."""
    body = response.read().decode("utf-8", "replace").strip()
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    if isinstance(payload, dict) and payload.get("error"):
        return error_message(payload)
    return body.splitlines()[0][:300] if body else "(empty body)"
