"""How long the HTTP client takes from launch to its first request (target ≤ 0.5 s on an idle machine).

    uv run python scripts/bench_http_start.py [--runs 7]

A server of its own on loopback notes when each request arrives; ``localchat chat --backend server``
and ``localchat smoke`` are launched against it (a new process each time, the installed entry point),
and the time from launch to the first request's arrival is the figure. Beside it, in the same run:
a bare ``python -c pass`` and ``python -c 'import mlx_lm.generate'``, what the client paid for its
reply parser before ``backends.text_states`` (MLX and transformers).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from localchat.environment import collect

TARGET_S = 0.5
ENTRY = Path(sys.executable).with_name("localchat")
REPLY = (b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": "stop"}]}\n\n'
         b"data: [DONE]\n\n")


class FirstRequest:
    """A loopback server that notes when the first request of each launch arrives."""

    def __init__(self) -> None:
        self.arrived = threading.Event()
        self.at = 0.0
        watch = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self):
                if not watch.arrived.is_set():
                    watch.at = time.perf_counter()
                    watch.arrived.set()
                body = REPLY if self.command == "POST" else b'{"data": [{"id": "m"}], "status": "ok"}'
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream" if self.command == "POST" else "application/json")
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def launch(self, command: list[str]) -> float:
        self.arrived.clear()
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.arrived.wait(60)
        process.wait(60)
        return self.at - started


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    server = FirstRequest()
    cases = {"chat --backend server": lambda: server.launch([str(ENTRY), "chat", "--backend", "server",
                                                             "--base-url", server.url, "-m", "m", "hi"]),
             "smoke": lambda: server.launch([str(ENTRY), "smoke", "--base-url", server.url]),
             "python -c pass": lambda: timed([sys.executable, "-c", "pass"]),
             "import mlx_lm.generate": lambda: timed([sys.executable, "-c", "import mlx_lm.generate"])}
    figures: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(runs):  # interleaved, so that a busy moment falls on every case alike
        for name, run in cases.items():
            figures[name].append(run())
    print(f"{collect().hardware_label} · {runs} runs each, medians (launch → first request; the last two: to exit)")
    for name, values in figures.items():
        print(f"  {name:<24} {statistics.median(values):.3f} s")
    chat = statistics.median(figures["chat --backend server"])
    print(f"chat's first request at {chat:.3f} s: {'met' if chat <= TARGET_S else 'NOT met'} (target ≤ {TARGET_S} s); "
          f"{statistics.median(figures['import mlx_lm.generate']) / chat:.1f}× less than importing mlx_lm.generate "
          "alone")


if __name__ == "__main__":
    main()
