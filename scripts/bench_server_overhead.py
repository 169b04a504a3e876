"""What does going through mlx_lm.server cost over raw in-process mlx_lm, and how much of that is
localchat's HTTP client rather than the server?

    uv run python scripts/bench_server_overhead.py [--pairs 5] [--tokens 64] [--quick]
    uv run python scripts/bench_server_overhead.py --model smollm2 --variant q4

In one run, rounds of three arms after a warm-up: the same prompt at temperature 0
through raw ``mlx_lm.stream_generate`` in this process, through a launched ``mlx_lm.server`` via
localchat's HTTP backend (SSE parsing and the one clock included), and through the official
``openai`` client against the same server with the same request body (``extra_body``), timed the
same way (first and last visible text, the server's usage for the token count). Raw goes first in
every round (the server idles meanwhile); the two clients then alternate which follows it, so
neither always meets a server just woken. Every request gets
a fresh prompt prefix so the server's prompt cache cannot favour an arm. Prints each arm's medians
and the medians of the rounds' own decode ratios (server/raw target ≥ 0.95; localchat/openai
≥ 0.99) and TTFT differences (server overhead ≤ 20 ms; localchat vs openai within 2 ms). On this
CPU SmolLM2's TTFT is seconds and varies by more than 2 ms between any two requests: ``--model
demo`` (~80 ms) resolves the clients' TTFT difference.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench_overhead import PROMPT, model_dir, raw_run
from openai import OpenAI

from localchat.backends import GenerationParams
from localchat.backends.http import make_client
from localchat.backends.openai_http import ServerBackend
from localchat.conversation.history import Conversation
from localchat.conversation.turn import ChatSession
from localchat.environment import collect
from localchat.server.launch import free_port, launch, wait_ready


def server_run(backend: ServerBackend, prompt: str, max_tokens: int) -> tuple[float, float]:
    session = ChatSession(backend, Conversation(), GenerationParams(max_tokens=max_tokens), use_history=False)
    stats = session.ask(prompt).stats
    assert not stats.estimated, "the server sent no usage"
    return stats.ttft_s, stats.decode_tps


def openai_run(client, backend: ServerBackend, prompt: str, max_tokens: int) -> tuple[float, float]:
    """The official client, sending the body localchat would send, timed as localchat times."""
    start = time.perf_counter()
    params = GenerationParams(max_tokens=max_tokens)
    body = backend.request_body([{"role": "user", "content": prompt}], params)
    fixed = {k: body.pop(k) for k in ("model", "messages", "stream", "stream_options")}
    first = last = None
    tokens = 0
    for chunk in client.chat.completions.create(**fixed, extra_body=body):
        if chunk.choices and chunk.choices[0].delta.content:
            last = time.perf_counter()
            first = first or last
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    assert tokens, "the server sent no usage"
    return first - start, (tokens - 1) / (last - first)


def report(label: str, runs: dict[str, list[tuple[float, float]]], base: str, other: str,
           ratio_target: float, ttft_target_ms: float) -> None:
    """Medians of each arm, and the medians of the rounds' own ratio and difference (the two
    runs of a round are seconds apart, so a slow spell of the machine hits both)."""
    med = lambda arm, k: statistics.median(r[k] for r in runs[arm])  # noqa: E731
    pairs = list(zip(runs[base], runs[other]))
    tps_ratio = statistics.median(o[1] / b[1] for b, o in pairs)
    ttft_diff = statistics.median(o[0] - b[0] for b, o in pairs)
    print(f"  {label}")
    print(f"    decode tok/s  {base} {med(base, 1):8.1f}   {other} {med(other, 1):8.1f}   "
          f"paired ratio {tps_ratio:.3f} (target ≥ {ratio_target})")
    print(f"    TTFT          {base} {med(base, 0) * 1e3:7.1f}ms  {other} {med(other, 0) * 1e3:7.1f}ms  "
          f"paired difference {ttft_diff * 1e3:+.1f} ms (target ≤ {ttft_target_ms:g} ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="a small model (for a fast look)")
    parser.add_argument("--variant", choices=["bf16", "q4"], default="q4")
    parser.add_argument("--model", help="a real model (models.yaml id or directory) instead of random weights")
    args = parser.parse_args()
    from mlx_lm import load

    env = collect()
    print(f"hardware: {env.hardware_label} · mlx {env.mlx_version} · mlx-lm {env.mlx_lm_version}")
    path = model_dir(args.variant, "quick" if args.quick else "full", args.model)
    model, tokenizer = load(str(path))
    log = Path(tempfile.gettempdir()) / "localchat-bench-server.log"
    server = launch(str(path), port=free_port(), log_path=log)
    try:
        wait_ready(server)
        backend = ServerBackend(make_client(server.base_url), str(path))
        client = OpenAI(base_url=server.base_url, api_key="not-needed", max_retries=0)
        arms = {"raw": lambda p: raw_run(model, tokenizer, [{"role": "user", "content": p}], args.tokens),
                "localchat": lambda p: server_run(backend, p, args.tokens),
                "openai": lambda p: openai_run(client, backend, p, args.tokens)}
        for name, arm in arms.items():  # warm-up
            arm(f"[warm-up {name}] {PROMPT}")
        runs = {name: [] for name in arms}
        for i in range(args.pairs):  # raw first; then the two clients, each leading every other round
            for name in ("raw", "localchat", "openai") if i % 2 == 0 else ("raw", "openai", "localchat"):
                runs[name].append(arms[name](f"[{i} {name}] {PROMPT}"))
        backend.close()
        client.close()
    finally:
        server.stop()
    print(f"\n[{path.name}] {args.pairs} rounds (raw, then the clients in alternating order), "
          f"{args.tokens} tokens a reply")
    report("raw in-process vs mlx_lm.server via localchat", runs, "raw", "localchat", 0.95, 20)
    report("the openai client vs localchat's client, same server", runs, "openai", "localchat", 0.99, 2)


if __name__ == "__main__":
    main()
