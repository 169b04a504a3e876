"""Server backend: the history builder's messages, POSTed to an OpenAI-compatible server.

Made for ``mlx_lm.server`` and fine with vLLM, llama-server or LM Studio. Token counts come from
the server's ``usage`` (requested with ``stream_options.include_usage``); when a server sends
none, they are counted with the local tokenizer (or, lacking one, from the chunks) and labelled
estimates. The API key is a Bearer header only: never printed, logged or recorded.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from localchat.backends import (
    Event,
    Finished,
    GenerationParams,
    Message,
    TextChunk,
    chat_template_ids,
)
from localchat.backends.sse import StreamError, error_message, iter_chunks
from localchat.errors import LocalchatError
from localchat.registry import ModelRef

DEFAULT_TIMEOUT = httpx.Timeout(connect=5.0, read=300.0, write=30.0, pool=5.0)
SERVER_DEFAULT_MODEL = "default_model"  # mlx_lm.server's name for the model it was started with


class ServerError(LocalchatError):
    pass


def make_client(base_url: str, api_key: str | None = None, timeout: httpx.Timeout = DEFAULT_TIMEOUT,
                transport: httpx.BaseTransport | None = None) -> httpx.Client:
    """One pooled client for the whole session (connections are reused across turns);
    ``transport`` is for tests (``httpx.MockTransport``)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.Client(base_url=base_url.rstrip("/") + "/", headers=headers, timeout=timeout,
                        transport=transport)


def backend_for(base_url: str, ref: ModelRef | None, *, name: str | None = None, api_key: str | None = None,
                load_tokenizer: Callable[[], Any] | None = None) -> ServerBackend:
    """A backend for a registry model (sent as the location the server loads), or for a bare
    ``name`` only the server knows, or for the server's own model when both are None."""
    return ServerBackend(
        make_client(base_url, api_key),
        ref.location if ref else (name or SERVER_DEFAULT_MODEL),
        model_id=ref.id if ref else (name or "the server's model"),
        load_tokenizer=load_tokenizer,
        chat_template_kwargs=ref.chat_template_kwargs if ref else None,
    )


def describe_http_error(exc: httpx.HTTPError, url: str) -> str:
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect to {url}: is a server running? Start one with: localchat serve"
    if isinstance(exc, httpx.TimeoutException):
        return f"{url} did not answer in time ({type(exc).__name__})"
    if isinstance(exc, httpx.RemoteProtocolError):
        return f"{url} closed the connection without a complete response ({exc})"
    return f"HTTP failure talking to {url}: {exc}"


def _usage_counts(usage: dict[str, Any]) -> tuple[int, int, int]:
    details = usage.get("prompt_tokens_details") or {}
    return (int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
            int(details.get("cached_tokens") or 0))


class ServerBackend:
    name = "server"

    def __init__(self, client: httpx.Client, model_field: str, *, model_id: str | None = None,
                 load_tokenizer: Callable[[], Any] | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None):
        self.client = client
        self.model_field = model_field
        self.model_id = model_id or model_field
        self._load_tokenizer = load_tokenizer
        self._tokenizer: Any = None
        self.chat_template_kwargs = dict(chat_template_kwargs or {})

    @property
    def tokenizer(self) -> Any:
        """The model's local tokenizer, loaded on first need (estimates, --max-context-tokens)."""
        if self._tokenizer is None and self._load_tokenizer is not None:
            self._tokenizer, self._load_tokenizer = self._load_tokenizer(), None
        return self._tokenizer

    @property
    def url(self) -> str:
        return str(self.client.base_url).rstrip("/")

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
        if self.chat_template_kwargs:
            body["chat_template_kwargs"] = self.chat_template_kwargs
        return body

    def count_tokens(self, messages: list[Message]) -> int | None:
        if self.tokenizer is None:
            return None
        return len(chat_template_ids(self.tokenizer, messages, self.chat_template_kwargs))

    def stream(self, messages: list[Message], params: GenerationParams) -> Iterator[Event]:
        url = f"{self.url}/chat/completions"
        parts: list[str] = []
        finish, usage, chunks = None, None, 0
        try:
            with self.client.stream("POST", "chat/completions",
                                    json=self.request_body(messages, params)) as response:
                if response.status_code >= 400:
                    raise ServerError(f"HTTP {response.status_code} from {url}: {self._error_body(response)}")
                for payload in iter_chunks(response.iter_lines()):
                    usage = payload.get("usage") or usage
                    for choice in payload.get("choices") or []:
                        content = (choice.get("delta") or {}).get("content")
                        if content:
                            parts.append(content)
                            chunks += 1
                            yield TextChunk(content)
                        finish = choice.get("finish_reason") or finish
        except httpx.HTTPError as exc:
            raise ServerError(describe_http_error(exc, url)) from None
        if finish is None:
            raise StreamError(f"the stream from {url} ended before the reply finished")
        yield self._finished(finish, usage, messages, "".join(parts), chunks)

    def _finished(self, finish: str, usage: dict | None, messages: list[Message], text: str,
                  chunks: int) -> Finished:
        if usage:
            prompt, completion, cached = _usage_counts(usage)
            return Finished(finish, prompt, completion, cached)
        prompt = self.count_tokens(messages)
        completion = len(self.tokenizer.encode(text, add_special_tokens=False)) if self.tokenizer else chunks
        return Finished(finish, prompt or 0, completion, 0, estimated=True)

    @staticmethod
    def _error_body(response: httpx.Response) -> str:
        body = response.read().decode("utf-8", "replace")
        try:
            return error_message(json.loads(body))
        except ValueError:
            return body.strip().splitlines()[0][:300] if body.strip() else "(empty body)"

    def close(self) -> None:
        self.client.close()
