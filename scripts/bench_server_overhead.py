"""What does going through mlx_lm.server cost over raw in-process mlx_lm?

    uv run python scripts/bench_server_overhead.py [--pairs 5] [--tokens 64] [--quick]

In one run, alternating (raw, server, raw, server, …) after a warm-up: the same prompt at
temperature 0 through raw ``mlx_lm.stream_generate`` in this process and through a launched
``mlx_lm.server`` via localchat's HTTP backend (SSE parsing and the one clock included), on the
mid-size random-weight model of ``bench_overhead.py``. Each pair gets a fresh prompt prefix so the
server's prompt cache cannot make its side look faster. Prints the median decode tok/s ratio
(target ≥ 0.95) and the TTFT overhead in ms (target ≤ 20 ms).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench_overhead import PROMPT, model_dir, raw_run

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
        prompt = lambda i: f"[{i}] {PROMPT}"  # noqa: E731
        raw_run(model, tokenizer, [{"role": "user", "content": prompt(-1)}], args.tokens)
        server_run(backend, prompt(-1), args.tokens)
        raw, served = [], []
        for i in range(args.pairs):
            raw.append(raw_run(model, tokenizer, [{"role": "user", "content": prompt(i)}], args.tokens))
            served.append(server_run(backend, prompt(i), args.tokens))
        backend.close()
    finally:
        server.stop()
    med = lambda runs, k: statistics.median(r[k] for r in runs)  # noqa: E731
    raw_ttft, srv_ttft, raw_tps, srv_tps = med(raw, 0), med(served, 0), med(raw, 1), med(served, 1)
    print(f"\n[{path.name}] raw in-process vs mlx_lm.server via localchat, {args.pairs} alternating pairs, median")
    print(f"  decode tok/s  raw {raw_tps:8.1f}   server {srv_tps:8.1f}   ratio {srv_tps / raw_tps:.3f} (target ≥ 0.95)")
    print(f"  TTFT          raw {raw_ttft * 1e3:7.1f}ms  server {srv_ttft * 1e3:7.1f}ms  "
          f"overhead {(srv_ttft - raw_ttft) * 1e3:+.1f} ms (target ≤ 20 ms)")


if __name__ == "__main__":
    main()
