"""What serving several models on one port costs: the front's hop against its engine child, a cold
load by model, the memory of the whole process tree as models come and go, and users spread over
two models that do not both fit (what swapping costs).

    uv run python scripts/bench_router.py [--rounds 8] [--tokens 48] [--requests 6]

1. **Hop.** ``serve`` of the demo (a TTFT of milliseconds; a copy of it with no end token, so that
   every reply is 128 tokens through every API: Messages has no ``logit_bias`` to ban one) and of
   ``smollm2`` (a decode of seconds); the same streaming request straight to the engine child (its
   URL from ``/localchat/ps``), through the front (chat completions relayed as they come: the engine
   writes the model's id itself), through the front's Anthropic Messages API, and through a second
   front (``localchat gateway --upstream`` in front of the ``serve``), in rotation, the same prompt
   each time (the engine has it cached, as a client asking again finds it: what a relay adds does
   not depend on the prefill, whose own swing would hide it; SmolLM2's TTFT is then one step of
   ~0.1 s, not 0.8 s of prefill swinging by ±10 ms from run to run). Printed: medians, and the
   median of each round's difference (TTFT) and ratio (decode) against the engine direct (the
   second front against the first). Targets: TTFT ≤ +10 ms, decode ≥ 0.99×. Each is measured on
   shared cores, then with the engine alone on one core (Linux; the client and the relays on the
   others), as a Mac's many cores leave it: at ~430 tok/s any process woken on a token that lands on
   a core the engine's threads want shows in its decode. Beside them, the floor:
   ``scripts/bare_relay.py`` (bytes from socket to socket on uvloop, no HTTP, no app) before the same
   engine, a second bare relay before that one (the floor under a second hop, against the first),
   and each relay's own CPU a token (1b: a front, ``--plain``, a second front, a bare relay).
2. **Cold loads.** ``serve -m demo -m demo-tools -m smollm2``: each other model's first request
   (the load is in its TTFT) against its second; the front's own "loaded … in" figure.
3. **Memory.** The resident memory of the front and every child (``/proc``), with nothing loaded
   (after the first model's idle unload), one model, two, and after the idle unload. Target: back
   within 50 MB of the empty front.
4. **Swapping.** Two users on demo and two on demo-tools, ``--requests`` each, under a budget that
   holds one (``--memory-limit 50MB``) and one that holds both: TTFT percentiles and the swaps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from model_variants import register_demo_variants

from localchat.backends.http import shared_ssl_context
from localchat.environment import collect
from localchat.processes import resident_bytes
from localchat.serve.started import StartedServe
from localchat.server.launch import free_port

PROMPT = "Write a short paragraph about the sea, the wind and a small boat."
# the demo with no end token: every reply is ``max_tokens`` long, as a big model's reply often is
ENDLESS = {"config.json": {"eos_token_id": []}, "tokenizer_config.json": {"eos_token": None}}
HELLO = "Remember the code harbor 17. Reply only OK."
ASKED_AGAIN = f"{PROMPT} [hop]"
SSL = shared_ssl_context()  # (a client made for each request would build one, ~20 ms of every TTFT's noise)


class Serve(StartedServe):
    def __init__(self, home: Path, *args: str):
        home.mkdir(parents=True, exist_ok=True)
        self.log_path = home / "front.log"
        super().__init__(home, *args, log=self.log_path.open("w"))
        self.wait_ready()

    def log(self) -> str:
        return self.log_path.read_text()

    def tree_bytes(self) -> int:
        pids = [self.proc.pid, *(row["pid"] for row in self.held() if row["pid"])]
        return sum(resident_bytes(pid) or 0 for pid in pids)


def streamed(base_url: str, model: str, prompt: str, max_tokens: int, api: str = "chat") -> tuple[float, float]:
    """(TTFT s, decode tok/s) as a client times them: to the first text, then over the text; through
    chat completions or Anthropic's Messages (``api="messages"``)."""
    body: dict = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                  "temperature": 0.0, "stream": True}
    if api == "chat":
        body |= {"stream_options": {"include_usage": True}}
    started, first, last, tokens = time.perf_counter(), None, None, 0
    path = "/chat/completions" if api == "chat" else "/messages"
    with httpx.stream("POST", base_url + path, json=body, timeout=300, verify=SSL) as response:
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if api == "chat" and chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if api != "chat" and chunk.get("type") == "message_delta":
                tokens = chunk["usage"]["output_tokens"]
            text = chunk["choices"][0]["delta"].get("content") if api == "chat" and chunk.get("choices") else \
                chunk.get("delta", {}).get("text") if chunk.get("type") == "content_block_delta" else None
            if text:
                last = time.perf_counter()
                first = first or last
    rate = (tokens - 1) / (last - first) if first and last and last > first else float("nan")
    return (first or time.perf_counter()) - started, rate


class Gateway:
    """``localchat gateway --upstream`` in front of a serve: a second front."""

    def __init__(self, upstream: str, model: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "localchat", "gateway", "--upstream", upstream, "-m", model,
                                      "--port", str(self.port), "--api", "anthropic"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for line in self.proc.stdout:
            if "Ctrl+C stops it" in line:
                break

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


class BareRelay:
    """``scripts/bare_relay.py`` before an engine: the floor under any Python relay (no app at all)."""

    def __init__(self, engine_url: str):
        from urllib.parse import urlsplit

        where = urlsplit(engine_url)
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("bare_relay.py")),
                                      where.hostname or "127.0.0.1", str(where.port)], stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout is not None
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (user + system), from /proc (Linux); NaN elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_core() -> tuple[int, ...]:
    """A core for the engine alone, where one can be given (Linux, two cores or more): on a Mac's
    many cores a relay never wakes on the engine's; on two shared ones any extra process can."""
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    return (max(cores),) if len(cores) >= 2 else ()


def pin(pid: int, cores: set[int]) -> None:
    """Every thread of a process (those it starts later inherit it) to ``cores`` (Linux)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cores)


def hop(home: Path, model: str, rounds: int, tokens: int, engine_core: int | None) -> None:
    serve = Serve(home / f"hop-{model}", "-m", model, "--keep-alive", "never", "--api", "anthropic")
    gateway = Gateway(serve.url + "/v1", model)
    bare = bare_twice = None
    mine = os.sched_getaffinity(0) if engine_core is not None else set()
    try:
        row = serve.held()[0]
        engine = row["engine_url"]
        bare = BareRelay(engine)
        bare_twice = BareRelay(bare.url)  # (two hops that do nothing: the floor under a second front)
        if engine_core is not None:  # (the engine on a core of its own; the client and every relay on the rest)
            pin(row["pid"], {engine_core})
            rest = mine - {engine_core}
            for pid in (os.getpid(), serve.proc.pid, gateway.proc.pid, bare.proc.pid, bare_twice.proc.pid):
                pin(pid, rest)
        arms = {"direct": (engine, "default_model", "chat"),  # (the engine knows its model by that name)
                "front": (serve.url + "/v1", model, "chat"),
                "messages": (serve.url + "/v1", model, "messages"), "two fronts": (gateway.url + "/v1", model, "chat"),
                "bare relay": (bare.url + "/v1", "default_model", "chat"),
                "two bare": (bare_twice.url + "/v1", "default_model", "chat")}
        for name, (url, named, api) in arms.items():
            print(f"  warm-up {name}: {streamed(url, named, ASKED_AGAIN, tokens, api)}")
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in arms}
        order = list(arms)
        for i in range(rounds):
            for name in order[i % len(order):] + order[:i % len(order)]:
                url, named, api = arms[name]
                runs[name].append(streamed(url, named, ASKED_AGAIN, tokens, api))
    finally:
        for relay in (bare_twice, bare):
            if relay is not None:
                relay.stop()
        gateway.stop()
        serve.stop()
        if mine:
            os.sched_setaffinity(0, mine)  # (what this script starts next runs anywhere again)
    where = "shared cores" if engine_core is None else f"the engine alone on core {engine_core}, the rest elsewhere"
    print(f"\n1. the front's hop ({model}, {rounds} rounds, {tokens} tokens, streaming; {where})")
    for name, timings in runs.items():
        rates = [r for _, r in timings if r == r]
        print(f"  {name:<11} TTFT {statistics.median(t for t, _ in timings) * 1e3:7.1f} ms · "
              f"{statistics.median(rates) if rates else float('nan'):6.1f} tok/s")
    for name, against in (("front", "direct"), ("messages", "direct"), ("two fronts", "front"),
                          ("bare relay", "direct"), ("two bare", "bare relay")):  # (the floor under each hop)
        pairs = list(zip(runs[against], runs[name]))
        delta = statistics.median(f[0] - d[0] for d, f in pairs) * 1e3
        ratios = [f[1] / d[1] for d, f in pairs if f[1] == f[1] and d[1] == d[1] and d[1] > 0]
        ratio = statistics.median(ratios) if ratios else float("nan")  # (a reply of one token has no decode)
        ok = delta <= 10 and (ratio != ratio or ratio >= 0.99)
        print(f"  {name} − {against}: TTFT {delta:+.1f} ms · decode {ratio:.3f}×  ({'met' if ok else 'NOT met'}: "
              "≤ +10 ms, ≥ 0.99×)")


def relay_cpu(home: Path, replies: int = 20) -> None:
    """The front's own CPU a request and a token, side by side: our engine's reply relayed as it comes,
    mlx_lm.server's as it is (``--plain``: every chunk parsed for the path to rename), the reply
    translated into Anthropic's events (through the one client path), a second front's (``gateway
    --upstream`` before a serve: the first front's chunks read and relayed), and a bare relay's."""
    demo = "demo-endless"
    print("\n1b. a relay's CPU (the demo, no end token): a request, and each token of its reply")
    for label, args, relay, api in (("relayed as it comes (our engine)", (), "front", "chat"),
                                    ("parsed and renamed (serve --plain)", ("--plain",), "front", "chat"),
                                    ("translated (Anthropic Messages)", ("--api", "anthropic"), "front", "messages"),
                                    ("a second front (gateway --upstream)", (), "gateway", "chat"),
                                    ("a bare relay (no HTTP, no app: the floor)", (), "bare", "chat")):
        serve = Serve(home / f"cpu-{api}-{len(args)}-{relay}", "-m", demo, "--keep-alive", "never", *args)
        other = BareRelay(serve.held()[0]["engine_url"]) if relay == "bare" else \
            Gateway(serve.url + "/v1", demo) if relay == "gateway" else None
        url, pid = (other.url, other.proc.pid) if other is not None else (serve.url, serve.proc.pid)
        try:
            named = "default_model" if relay == "bare" else demo  # (the engine's own name for its model)
            for k in range(3):
                streamed(url + "/v1", named, f"{PROMPT} [warm-{k}]", 128, api)
            spent = {}
            for tokens in (1, 128):
                before = cpu_seconds(pid)
                for k in range(replies):
                    streamed(url + "/v1", named, f"{PROMPT} [{tokens}-{k}]", tokens, api)
                spent[tokens] = (cpu_seconds(pid) - before) / replies
        finally:
            if other is not None:
                other.stop()
            serve.stop()
        per_token = (spent[128] - spent[1]) / 127 * 1e6
        print(f"  {label:<42} {spent[1] * 1e3:5.1f} ms a request + {per_token:4.0f} µs a token")


def cold_loads_and_memory(home: Path) -> None:
    serve = Serve(home / "cold", "-m", "demo", "-m", "demo-tools", "-m", "smollm2", "--keep-alive", "10s")
    try:
        print("\n2. cold loads (the first request's TTFT includes the load) · 3. the process tree's memory")
        deadline = time.monotonic() + 30
        while serve.held() and time.monotonic() < deadline:
            time.sleep(0.2)
        empty = serve.tree_bytes()
        print(f"  nothing loaded: {empty / 1e6:7.1f} MB (the front alone)")
        for model in ("demo-tools", "smollm2"):
            cold = streamed(serve.url + "/v1", model, HELLO, 8)[0]
            warm = streamed(serve.url + "/v1", model, HELLO + " ", 8)[0]
            line = next(line for line in serve.log().splitlines() if f"loaded {model} in" in line)
            print(f"  {model:<11} cold TTFT {cold:6.2f} s · warm {warm * 1e3:6.1f} ms · front: {line.strip()}")
            print(f"    held: {', '.join(r['model'] for r in serve.held())} · tree {serve.tree_bytes() / 1e6:7.1f} MB")
        deadline = time.monotonic() + 30
        while serve.held() and time.monotonic() < deadline:
            time.sleep(0.2)
        after = serve.tree_bytes()
        ok = after - empty <= 50e6
        print(f"  after the idle unload: {after / 1e6:7.1f} MB ({(after - empty) / 1e6:+.1f} MB against empty: "
              f"{'met' if ok else 'NOT met'}, ≤ 50 MB)")
    finally:
        serve.stop()


def swapping(home: Path, requests: int, limit: str | None) -> None:
    args = ["-m", "demo", "-m", "demo-tools", *(["--memory-limit", limit] if limit else [])]
    serve = Serve(home / f"swap-{limit}", *args)
    ttfts: dict[str, list[float]] = {"demo": [], "demo-tools": []}
    errors: list[str] = []

    def user(model: str, k: int) -> None:
        for i in range(requests):
            try:
                ttfts[model].append(streamed(serve.url + "/v1", model, f"[{k}-{i}] {HELLO}", 8)[0])
            except httpx.HTTPError as exc:
                errors.append(type(exc).__name__)

    try:
        users = [threading.Thread(target=user, args=(m, k)) for k, m in enumerate(["demo", "demo-tools"] * 2)]
        started = time.perf_counter()
        for thread in users:
            thread.start()
        for thread in users:
            thread.join()
        took = time.perf_counter() - started
        swaps = serve.log().count("to make room")
    finally:
        serve.stop()
    every = sorted(t for ts in ttfts.values() for t in ts)
    q = statistics.quantiles(every, n=20) if len(every) > 1 else every * 19
    print(f"  budget {limit or 'for both':>9}: {len(every)} replies in {took:5.1f}s · TTFT p50 {q[9] * 1e3:7.1f} ms · "
          f"p95 {q[18] * 1e3:7.1f} ms · max {every[-1] * 1e3:7.1f} ms · {swaps} unloads to make room · "
          f"{len(errors)} errors")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--models", default="demo,smollm2", help="the models whose hop is measured")
    parser.add_argument("--hop-only", action="store_true", help="measure the hop alone (part 1)")
    args = parser.parse_args()
    env = collect()
    print(f"hardware: {env.hardware_label} · mlx {env.mlx_version} · mlx-lm {env.mlx_lm_version}")
    with tempfile.TemporaryDirectory(prefix="bench-router-") as where:  # (its prompt caches: ~100 MB a model)
        measure(Path(where), args)


def measure(home: Path, args: argparse.Namespace) -> None:
    register_demo_variants(home, {"demo-endless": ENDLESS})
    for model in args.models.split(","):
        for engine_core in (None, *own_core()):
            if model == "demo":  # (ms a token: a chunk's cost, or a wake-up's, shows)
                hop(home, "demo-endless", 3 * args.rounds, 128, engine_core)
            else:
                hop(home, model, args.rounds, args.tokens, engine_core)  # seconds a reply: the relay's share of it
    relay_cpu(home)
    if args.hop_only:
        return
    cold_loads_and_memory(home)
    print(f"\n4. two users on demo, two on demo-tools, {args.requests} requests each")
    swapping(home, args.requests, None)
    swapping(home, args.requests, "50MB")


if __name__ == "__main__":
    main()
