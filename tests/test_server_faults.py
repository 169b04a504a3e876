"""The HTTP backend against faulty servers: every failure is one message, history is unchanged,
and the REPL goes on. HTTP-level faults use httpx.MockTransport; socket-level ones a raw server."""

import io
import json
import socket
import threading
import time

import httpx
import pytest
from rich.console import Console

from localchat.backends import GenerationParams
from localchat.backends.openai_http import ServerBackend
from localchat.cli.render import ChatUI
from localchat.cli.repl import Repl
from localchat.conversation.history import Conversation, Turn
from localchat.conversation.turn import ChatSession, TurnStatus

BASE = "http://127.0.0.1:1/v1/"


def sse(*payloads, done=True) -> bytes:
    body = "".join(f"data: {json.dumps(p)}\n\n" for p in payloads)
    return (body + ("data: [DONE]\n\n" if done else "")).encode()


def delta(text, finish=None, usage=None):
    chunk = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}
    if usage:
        chunk["usage"] = usage
    return chunk


USAGE = {"prompt_tokens": 20, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 12}}


def chat_only(handler):
    """A fake server: ``handler`` answers chat completions; /v1/models (asked once, for the
    context length) is not there, as on some servers."""
    return lambda request: (httpx.Response(404) if request.url.path.endswith("/models") else handler(request))


def backend_for(handler, tokenizer_loader=None) -> ServerBackend:
    client = httpx.Client(base_url=BASE, transport=httpx.MockTransport(chat_only(handler)), timeout=2.0)
    return ServerBackend(client, "default_model", load_tokenizer=tokenizer_loader)


def chat_with(backend) -> ChatSession:
    conversation = Conversation("SYS")
    conversation.commit(Turn("earlier question", "earlier answer"))
    return ChatSession(backend, conversation, GenerationParams(max_tokens=16))


def test_request_carries_the_history_builder_messages_and_usage_option():
    seen = {}

    def handler(request: httpx.Request):
        seen.update(json.loads(request.content))
        seen["auth"] = request.headers.get("authorization")
        return httpx.Response(200, content=sse(delta("Hi"), delta("!", "stop"), {"choices": [], "usage": USAGE}))

    chat = chat_with(backend_for(handler))
    result = chat.ask("new question")
    assert seen["messages"] == [{"role": "system", "content": "SYS"},
                                {"role": "user", "content": "earlier question"},
                                {"role": "assistant", "content": "earlier answer"},
                                {"role": "user", "content": "new question"}]
    assert seen["messages"] == result.messages
    assert seen["stream"] is True and seen["stream_options"] == {"include_usage": True}
    assert seen["model"] == "default_model" and seen["auth"] is None
    assert (result.text, result.committed) == ("Hi!", True)
    s = result.stats
    assert (s.prompt_tokens, s.completion_tokens, s.cached_tokens, s.estimated) == (20, 3, 12, False)


def test_usage_on_the_last_content_chunk_is_read_too():
    def handler(request):
        return httpx.Response(200, content=sse(delta("A"), delta("B", "stop", usage=USAGE)))

    result = chat_with(backend_for(handler)).ask("q")
    assert result.stats.prompt_tokens == 20 and not result.stats.estimated


def test_without_usage_counts_are_local_estimates(demo):
    _, tokenizer = demo

    def handler(request):
        return httpx.Response(200, content=sse(delta("harbor"), delta(" 17", "stop")))

    result = chat_with(backend_for(handler, lambda: tokenizer)).ask("q")
    assert result.stats.estimated and result.committed
    assert result.stats.prompt_tokens == len(tokenizer.apply_chat_template(result.messages, add_generation_prompt=True))
    assert result.stats.completion_tokens == len(tokenizer.encode("harbor 17", add_special_tokens=False))


def test_api_key_is_sent_as_bearer_and_never_in_the_body():
    seen = {}

    def handler(request):
        seen["auth"], seen["body"] = request.headers["authorization"], request.content.decode()
        return httpx.Response(200, content=sse(delta("x", "stop", usage=USAGE)))

    from localchat.backends.http import make_client

    client = make_client("http://127.0.0.1:1/v1", api_key="sk-secret", transport=httpx.MockTransport(handler))
    ChatSession(ServerBackend(client, "m"), Conversation(), GenerationParams()).ask("q")
    assert seen["auth"] == "Bearer sk-secret" and "sk-secret" not in seen["body"]


def test_keepalive_only_then_content_measures_ttft_at_the_content():
    def body():
        for _ in range(3):
            time.sleep(0.1)
            yield b": keepalive 1/10\n\n"
        yield sse(delta("late", "stop", usage=USAGE))

    result = chat_with(backend_for(lambda r: httpx.Response(200, content=body()))).ask("q")
    assert result.text == "late" and result.stats.ttft_s >= 0.3


@pytest.mark.parametrize("status, body, needle", [
    (404, {"error": "model 'x' not found"}, "HTTP 404"),
    (500, {"error": {"message": "out of memory"}}, "out of memory"),
    (500, "plain text failure", "plain text failure"),
])
def test_http_errors_show_their_body(status, body, needle):
    content = json.dumps(body).encode() if isinstance(body, dict) else body.encode()
    chat = chat_with(backend_for(lambda r: httpx.Response(status, content=content)))
    result = chat.ask("q")
    assert result.status is TurnStatus.ERROR and needle in result.error
    assert len(chat.conversation.turns) == 1


@pytest.mark.parametrize("make_error, needle", [
    (lambda r: (_ for _ in ()).throw(httpx.ConnectError("refused")), "localchat serve"),
    (lambda r: (_ for _ in ()).throw(httpx.ReadTimeout("slow")), "sent nothing"),
])
def test_connection_failures(make_error, needle):
    chat = chat_with(backend_for(lambda r: next(make_error(r))))
    result = chat.ask("q")
    assert needle in result.error and len(chat.conversation.turns) == 1


def test_garbage_sse_is_an_error_and_nothing_is_committed():
    chat = chat_with(backend_for(lambda r: httpx.Response(200, content=b"data: {not json\n\n")))
    result = chat.ask("q")
    assert "not JSON" in result.error and len(chat.conversation.turns) == 1


def test_stream_without_finish_is_incomplete():
    chat = chat_with(backend_for(lambda r: httpx.Response(200, content=sse(delta("part"), done=True))))
    result = chat.ask("q")
    assert result.text == "part" and "ended before the reply finished" in result.error
    assert not result.committed


class RawServer:
    """A socket server that misbehaves below HTTP: answers nothing, or cuts a stream."""

    def __init__(self, reply: bytes):
        self.reply = reply
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.recv(65536)
            conn.sendall(self.reply)
            conn.close()

    def backend(self) -> ServerBackend:
        client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}/v1/", timeout=5.0)
        return ServerBackend(client, "m")

    def close(self):
        self.sock.close()


def test_connection_closed_with_no_response():
    server = RawServer(b"")
    chat = chat_with(server.backend())
    result = chat.ask("q")
    server.close()
    assert "closed the connection without a complete response" in result.error
    assert len(chat.conversation.turns) == 1


def test_stream_cut_in_the_middle_keeps_partial_text_but_commits_nothing():
    chunk = f"data: {json.dumps(delta('partial '))}\n\n".encode()
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    server = RawServer(head + f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
    chat = chat_with(server.backend())
    result = chat.ask("q")
    server.close()
    assert result.text == "partial " and result.status is TurnStatus.ERROR
    assert not result.committed and len(chat.conversation.turns) == 1


def test_the_repl_goes_on_after_a_failure_and_marks_partial_text():
    calls = iter([httpx.Response(200, content=sse(delta("half"), done=False)),
                  httpx.Response(200, content=sse(delta("fine", "stop", usage=USAGE)))])
    err = io.StringIO()
    ui = ChatUI(out=io.StringIO(), err=Console(file=err, width=200))
    chat = chat_with(backend_for(lambda r: next(calls)))
    feed = iter(["first", "second", "/history", "/quit"])
    Repl(chat, ui, read_line=lambda _: next(feed)).run()
    out = err.getvalue()
    assert "partial reply above is incomplete" in out
    assert out.count("[TTFT 0.") == 2  # a turn that failed after its first token still has figures
    assert "history: 5 messages" in out  # SYS + earlier turn + the second (good) turn
    assert [t.user for t in chat.conversation.turns] == ["earlier question", "second"]
