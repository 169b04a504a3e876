"""Is `localchat load` ever what a load run measures? Its own ceiling against an instant server.

    uv run python scripts/bench_load_client.py [--users 1,2,4,8] [--seconds 5]

1. A real run: mlx_lm.server launched with the demo model, each concurrency in turn, history on;
   the fastest request rate any of them reached.
2. The same users against an instant fake server (another process, on loopback): a canned
   two-chunk stream with usage, answered at once. The request rate there is the client's ceiling.

Prints both, side by side, and their ratio; the load generator should sustain at least 10× the
fastest real run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from localchat.backends import GenerationParams
from localchat.bench.script import SCRIPTS_DIR, load_script
from localchat.environment import collect
from localchat.load.metrics import summarize
from localchat.load.run import LoadPlan, Run
from localchat.load.sweep import LoadOptions, Target
from localchat.registry import resolve
from localchat.server.launch import free_port, start_ready

CANNED = b"".join(f"data: {json.dumps(p)}\n\n".encode() for p in (
    {"choices": [{"index": 0, "delta": {"content": "OK"}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"content": "."}, "finish_reason": "stop"}]},
    {"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 2}})) + b"data: [DONE]\n\n"


class Instant(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._send(b'{"data": []}', "application/json")

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(CANNED, "text/event-stream")

    def _send(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serve_instant(port: int) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", port), Instant)
    server.daemon_threads = True
    server.serve_forever()


def rate(base_url: str, users: int, seconds: float, model: str | None) -> float:
    """Requests a second that ``users`` sustain against ``base_url`` for ``seconds``."""
    script = load_script(SCRIPTS_DIR / "recall-en.yaml")
    plan = LoadPlan(script=script, conversations=10_000, turns=None, think_time_s=0.0, duration_s=seconds,
                    params=GenerationParams(max_tokens=16), seed=0)
    target = Target(LoadOptions(base_url=base_url, model=model), on_status=lambda _: None)
    result = Run(plan, users, True, target.backend).execute()
    figures = summarize(result.records, result.gaps, result.wall_s, plan.slo)
    return figures["request_rate"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", default="1,2,4,8")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--serve-instant", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_instant:
        serve_instant(args.serve_instant)
        return
    counts = [int(n) for n in args.users.split(",")]
    server = start_ready(resolve("demo"), port=free_port())
    try:
        real = {n: rate(server.base_url, n, args.seconds, "demo") for n in counts}
    finally:
        server.stop()
    port = free_port()
    fake = subprocess.Popen([sys.executable, __file__, "--serve-instant", str(port)])
    try:
        time.sleep(1.0)
        instant = {n: rate(f"http://127.0.0.1:{port}/v1", n, args.seconds, None) for n in counts}
    finally:
        fake.terminate()
        fake.wait()
    print(f"on {collect().hardware_label}; {args.seconds:g} s a run, history on, recall-en")
    print("users | demo via mlx_lm.server req/s | instant fake server req/s")
    for n in counts:
        print(f"{n:>5} | {real[n]:>28.1f} | {instant[n]:>25.1f}")
    fastest, ceiling = max(real.values()), max(instant.values())
    print(f"client ceiling {ceiling:.0f} req/s = {ceiling / fastest:.1f}× the fastest real run ({fastest:.1f} req/s)")


if __name__ == "__main__":
    main()
