"""What the gateway's hop costs: the same request straight to mlx_lm.server and through
``localchat gateway`` (chat completions passed through, Anthropic Messages, OpenAI Responses).

    uv run python scripts/bench_gateway.py [--model smollm2] [--rounds 8] [--tokens 48]

One mlx_lm.server, one ``localchat gateway`` in front of it (its own process, as users run it),
and four arms through the official SDKs, streaming: ``direct`` (openai chat.completions to the
server), ``passthrough`` (the same through the gateway), ``anthropic`` (messages.stream through
the gateway) and ``responses`` (responses.create through the gateway). Each is timed by the
client as a user's would be: TTFT to the first text delta, decode over the deltas from the first
to the last with the server's token count. A warm-up of each, then rounds in which every arm runs
once, in an order that rotates from round to round; every request has a fresh prefix of the same
length, so the server's prompt cache favours none. Printed: each arm's medians, and for each
gateway arm the median of its rounds' own differences and ratios against ``direct`` (the arms of a
round are seconds apart, so a slow spell of the machine hits all of them). Targets: TTFT within
+10 ms of direct, decode ≥ 0.99× direct.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import anthropic
import openai

from localchat.environment import collect
from localchat.registry import resolve
from localchat.server.launch import free_port, start_ready

PROMPT = "Write a short paragraph about the sea, the wind and a small boat."
Timing = tuple[float, float]  # (TTFT s, decode tok/s)


def timed(deltas, started: float, tokens: Callable[[], int]) -> Timing:
    first = last = None
    count = 0
    for _ in deltas:
        last = time.perf_counter()
        first = first or last
        count += 1
    n = tokens() or count
    return first - started, (n - 1) / (last - first) if last > first else float("nan")


def direct_or_passthrough(client: openai.OpenAI, model: str, prompt: str, max_tokens: int) -> Timing:
    usage = {}
    started = time.perf_counter()

    def deltas():
        for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                                    max_tokens=max_tokens, temperature=0.0, stream=True,
                                                    stream_options={"include_usage": True}):
            if chunk.usage:
                usage["n"] = chunk.usage.completion_tokens
            if chunk.choices and chunk.choices[0].delta.content:
                yield chunk

    return timed(deltas(), started, lambda: usage.get("n", 0))


def messages(client: anthropic.Anthropic, prompt: str, max_tokens: int) -> Timing:
    usage = {}
    started = time.perf_counter()

    def deltas():
        with client.messages.stream(model="claude-sonnet-4-5", max_tokens=max_tokens,
                                    messages=[{"role": "user", "content": prompt}],
                                    extra_body={"temperature": 0.0}) as stream:
            for event in stream:
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    yield event
            usage["n"] = stream.get_final_message().usage.output_tokens

    return timed(deltas(), started, lambda: usage.get("n", 0))


def responses(client: openai.OpenAI, prompt: str, max_tokens: int) -> Timing:
    usage = {}
    started = time.perf_counter()

    def deltas():
        for event in client.responses.create(model="gpt-5", input=prompt, max_output_tokens=max_tokens,
                                             temperature=0.0, stream=True, store=False):
            if event.type == "response.output_text.delta":
                yield event
            elif event.type == "response.completed":
                usage["n"] = event.response.usage.output_tokens

    return timed(deltas(), started, lambda: usage.get("n", 0))


def start_gateway(upstream: str, model: str, port: int, log: Path) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-m", "localchat", "gateway", "--upstream", upstream, "-m", model,
                                "--port", str(port)], stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
                               env=os.environ | {"COLUMNS": "200"}, start_new_session=True)
    for line in process.stdout:
        if line.startswith("ready"):
            return process
    raise SystemExit(f"the gateway did not start: {log.read_text()[-800:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--prompt", default=PROMPT)
    args = parser.parse_args()
    env = collect()
    print(f"hardware: {env.hardware_label} · mlx {env.mlx_version} · mlx-lm {env.mlx_lm_version}")
    ref = resolve(args.model)
    logs = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    server = start_ready(ref, port=free_port(), log=logs / "server.log")
    gateway = None
    try:
        port = free_port()
        gateway = start_gateway(server.base_url, args.model, port, logs / "gateway.log")
        root = f"http://127.0.0.1:{port}"
        direct = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120)
        through = openai.OpenAI(base_url=root + "/v1", api_key="x", max_retries=0, timeout=120)
        claude = anthropic.Anthropic(base_url=root, api_key="x", max_retries=0, timeout=120)
        arms: dict[str, Callable[[str], Timing]] = {
            "direct": lambda p: direct_or_passthrough(direct, ref.location, p, args.tokens),
            "passthrough": lambda p: direct_or_passthrough(through, ref.location, p, args.tokens),
            "anthropic": lambda p: messages(claude, p, args.tokens),
            "responses": lambda p: responses(through, p, args.tokens),
        }
        names = list(arms)
        for name in names:
            arms[name](f"[warm-up {name[:3]}] {args.prompt}")
        runs: dict[str, list[Timing]] = {name: [] for name in names}
        for i in range(args.rounds):
            order = names[i % len(names):] + names[:i % len(names)]
            for j, name in enumerate(order):
                runs[name].append(arms[name](f"[{i:02d}-{j}] {args.prompt}"))
    finally:
        if gateway is not None:
            gateway.terminate()
            gateway.wait(10)
        server.stop()
    report(args, runs)
    print(f"logs: {logs}")


def report(args: argparse.Namespace, runs: dict[str, list[Timing]]) -> None:
    print(f"\n[{args.model}] {args.rounds} rounds, each arm once a round in rotating order, {args.tokens} tokens")
    print(f"  {'arm':<12} {'TTFT ms':>9} {'tok/s':>8} {'ΔTTFT ms':>10} {'decode ×':>9}")
    met = True
    for name, timings in runs.items():
        ttft = statistics.median(t for t, _ in timings) * 1e3
        tps = statistics.median(r for _, r in timings if r == r)  # (nan: every delta at one instant)
        if name == "direct":
            print(f"  {name:<12} {ttft:9.1f} {tps:8.1f}")
            continue
        pairs = list(zip(runs["direct"], timings))
        hop = statistics.median(o[0] - d[0] for d, o in pairs) * 1e3
        ratio = statistics.median(o[1] / d[1] for d, o in pairs if o[1] == o[1] and d[1] == d[1])
        ok = hop <= 10 and ratio >= 0.99
        met &= ok
        print(f"  {name:<12} {ttft:9.1f} {tps:8.1f} {hop:+10.1f} {ratio:9.3f}  {'met' if ok else 'NOT met'}")
    print(f"targets (TTFT ≤ +10 ms, decode ≥ 0.99× direct): {'all met' if met else 'not all met'}")


if __name__ == "__main__":
    main()
