"""A scripted HTTP server on 127.0.0.1 for fault tests: each path answers what the test set.

Unlike ``httpx.MockTransport`` it is a real socket, so the CLI's own client, timeouts and
connection handling are what is tested. Every reply is bounded: chunks are sent with optional
pauses, and the handler never waits for more than the test asked.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Reply:
    status: int = 200
    chunks: list[bytes] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "text/event-stream"})
    pause_s: float = 0.0  # before each chunk
    echo_headers: bool = False  # append the request's headers to the body (a server that leaks them)


def sse(*payloads) -> list[bytes]:
    """Each payload as one ``data:`` event, then ``[DONE]``; bytes and str pass through as lines."""
    out = []
    for p in payloads:
        if isinstance(p, bytes):
            out.append(p)
        elif isinstance(p, str):
            out.append(p.encode())
        else:
            out.append(f"data: {json.dumps(p)}\n\n".encode())
    return out + [b"data: [DONE]\n\n"]


def delta(text=None, finish=None, **extra) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}], **extra}


USAGE = {"prompt_tokens": 20, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 12}}
GOOD = sse(delta("Hi"), delta(" there", "stop"), {"choices": [], "usage": USAGE})


class FakeServer:
    """``replies[path]`` is one Reply, a list of them served in turn (cycling), or a function of the
    request's body (what a concurrent client gets must not depend on who asked first)."""

    def __init__(self) -> None:
        self.replies: dict[str, Reply | list[Reply] | Callable[[dict], Reply]] = {}
        self.served: dict[str, int] = {}
        self._lock = threading.Lock()
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.cut_short = threading.Event()  # a client went away before its reply was all sent
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                server.requests.append((self.path, dict(self.headers), body))
                path = self.path.split("?")[0].rstrip("/")
                reply = server.pick(path, body) or Reply(404, [b'{"error": "not found"}'],
                                                   {"Content-Type": "application/json"})
                self.send_response(reply.status)
                for key, value in reply.headers.items():
                    self.send_header(key, value)
                self.send_header("Connection", "close")
                self.end_headers()
                chunks = list(reply.chunks)
                if reply.echo_headers:
                    chunks.append(json.dumps(dict(self.headers)).encode())
                try:
                    for chunk in chunks:
                        if reply.pause_s:
                            time.sleep(reply.pause_s)
                        self.wfile.write(chunk)
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    server.cut_short.set()

            do_GET = do_POST = _answer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def pick(self, path: str, body: bytes = b"") -> Reply | None:
        reply = self.replies.get(path)
        if callable(reply):
            return reply(json.loads(body or b"{}"))
        if isinstance(reply, list):
            with self._lock:
                n = self.served[path] = self.served.get(path, -1) + 1
            return reply[n % len(reply)]
        return reply

    def chat(self, reply: Reply | list[Reply] | Callable[[dict], Reply]) -> None:
        self.replies["/v1/chat/completions"] = reply

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
