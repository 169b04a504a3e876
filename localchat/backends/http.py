"""The HTTP client of the server backend: built once, its API key checked, every failure one line.

The API key travels only as a Bearer header. A turn ends with one line when the server makes no
progress for ``timeout_s``: no bytes at all (httpx's read timeout), or only comments whose prefill
count does not advance; a "line" that never ends cannot fill memory.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable, Iterator
from functools import cache

import httpx

from localchat import bounded_json
from localchat.backends import DEFAULT_TIMEOUT_S
from localchat.backends.sse import ChatChunk, KeepAlive, StreamError, error_message
from localchat.errors import LocalchatError, UsageError

CONNECT_TIMEOUT_S = 5.0
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


@cache
def shared_ssl_context() -> ssl.SSLContext:
    """One TLS context for every client of this process: httpx builds a new one (reading the whole
    certificate store, 15-30 ms) for each client otherwise, and the gateway makes a client a request."""
    return httpx.create_ssl_context()


def make_client(base_url: str, api_key: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                transport: httpx.BaseTransport | None = None) -> httpx.Client:
    """One pooled client for the whole session (connections are reused across turns);
    ``transport`` is for tests (``httpx.MockTransport``)."""
    headers = {"Authorization": f"Bearer {check_api_key(api_key)}"} if api_key else {}
    timeout = httpx.Timeout(connect=CONNECT_TIMEOUT_S, read=timeout_s, write=30.0, pool=CONNECT_TIMEOUT_S)
    return httpx.Client(base_url=base_url.rstrip("/") + "/", headers=headers, timeout=timeout,
                        transport=transport, verify=shared_ssl_context())


def describe_http_error(exc: httpx.HTTPError, url: str, timeout_s: float | None = None) -> str:
    if isinstance(exc, httpx.ConnectTimeout):
        return f"cannot connect to {url}: no answer within {CONNECT_TIMEOUT_S:.0f}s (is the host right?)"
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect to {url}: nothing is listening there. Start a server with: {serve_command(url)}"
    if isinstance(exc, httpx.TimeoutException):
        limit = f" for {timeout_s:.0f}s" if timeout_s else ""
        return f"{url} sent nothing{limit} ({type(exc).__name__}); raise --timeout for very long prompts"
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)):  # a close, or a reset (RST)
        return f"{url} closed the connection without a complete response ({exc or type(exc).__name__})"
    return f"HTTP failure talking to {url}: {type(exc).__name__}"


def serve_command(url: str) -> str:
    """``localchat serve``, with the port of ``url`` when it is not serve's own default."""
    try:
        port = httpx.URL(url).port
    except (httpx.InvalidURL, ValueError):
        port = None
    from localchat.wording import run_as

    return f"{run_as()} serve" + (f" --port {port}" if port and port != 8080 else "")


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


def unfinished_tail(text: str, words: tuple[str, ...]) -> int:
    """How many characters at the end of ``text`` could be the start of one of ``words`` (what a
    stream holds back until its next chunk says what they are)."""
    return max((n for word in words for n in range(min(len(word) - 1, len(text)), 0, -1)
                if text.endswith(word[:n])), default=0)


class Redactor:
    """The API key cut out of a stream of text (and each of ``also``'s texts replaced by its
    value), wherever the chunks split it: the tail that could be the start of one is held back
    until the next chunk (or the end) says what it is."""

    def __init__(self, secret: str, also: dict[str, str] | None = None):
        self.replacements = {**({secret: REDACTED} if secret else {}), **(also or {})}
        self.pending = ""

    def feed(self, text: str) -> str:
        if not self.replacements:
            return text
        text = self.pending + text
        for old, new in self.replacements.items():
            text = text.replace(old, new)
        held = unfinished_tail(text, tuple(self.replacements))
        self.pending = text[len(text) - held:] if held else ""
        return text[:len(text) - held]

    def flush(self) -> str:
        rest, self.pending = self.pending, ""
        return rest


def refusal_hint(message: str, model_id: str) -> str | None:
    """A server's chat template that refuses a system message (mlx_lm.server answers 404 with the
    template's own words), explained with what to do; None for any other error."""
    if "System role not supported" not in message and "roles must alternate" not in message:
        return None
    return (f"the server's chat template for {model_id} refuses a system message ({message}): rerun with "
            "--system '' or, with the model on this machine, pass -m with it so localchat folds the system "
            "message into the first user message")


class ProgressWatch:
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
        if item.content or item.reasoning or item.tool_calls or item.finish_reason or item.usage:
            self.last = time.monotonic()


def error_body(response: httpx.Response) -> str:
    """The human part of an error response: its ``error`` message, or its first line of text."""
    body = response.read().decode("utf-8", "replace").strip()
    try:
        payload = bounded_json.loads(body)
    except ValueError:
        payload = None
    if isinstance(payload, dict) and payload.get("error"):
        return error_message(payload)
    return body.splitlines()[0][:300] if body else "(empty body)"
