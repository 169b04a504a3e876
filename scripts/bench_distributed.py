"""What serving from several ranks costs and saves on this machine, measured side by side in one run.

    uv run python scripts/bench_distributed.py [--turns 3] [--max-tokens 48]

For each setting (the demo on 1, 2 and 3 ranks; SmolLM2 on 1 and 3), ``localchat serve``'s own
launcher starts the server (mlx.launch for ranks > 1, ring over loopback), the same greedy
conversation is played through localchat's HTTP backend, and the one clock gives TTFT and decode
tok/s; each process's peak resident memory (``VmHWM``) is read before it stops. The demo has 4
heads, so its 3 ranks split layers (``--pipeline``); SmolLM2 has 9 heads and 3 KV heads, so 3
ranks split heads. On one 2-core machine more ranks are slower: they share two cores, and
mlx.launch's own I/O loop keeps one of them busy. What a Thunderbolt pair of Macs would change is
an estimate, printed as one.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from localchat.backends import GenerationParams
from localchat.backends.openai_http import backend_for
from localchat.conversation.history import Conversation
from localchat.conversation.turn import ChatSession
from localchat.environment import collect
from localchat.registry import resolve
from localchat.server.distributed import Ranks
from localchat.server.launch import free_port, start_ready

QUESTIONS = ["Remember the code harbor 17. Reply only OK.", "Tell me about the weather today.",
             "What was the code? Reply with the code only."]
SETTINGS = [("demo", None), ("demo", Ranks(count=2)), ("demo", Ranks(count=3, pipeline=True)),
            ("smollm2", None), ("smollm2", Ranks(count=3))]


def peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def server_processes(leader: int) -> list[int]:
    """The mlx_lm.server processes under ``leader`` (itself, or mlx.launch's ranks)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[3]) == leader and b"mlx_lm\x00server" in command:
            found.append(int(entry.name))
    return sorted(found)


def measure(model: str, ranks: Ranks | None, turns: int, max_tokens: int) -> dict:
    ref = resolve(model)
    server = start_ready(ref, port=free_port(), ranks=ranks, log=Path(f"/tmp/bench-distributed-{model}.log"))
    try:
        backend = backend_for(server.base_url, ref)
        chat = ChatSession(backend, Conversation.for_backend(backend, ref.default("system")),
                           GenerationParams(max_tokens=max_tokens, seed=0)).prepare()
        results = [chat.ask(q) for q in QUESTIONS[:turns]]
        backend.close()
        peaks = [peak_rss_mb(pid) for pid in server_processes(server.process.pid)]
    finally:
        server.stop()
    ttft = [r.stats.ttft_s for r in results if r.stats.ttft_s is not None]
    tps = [r.stats.decode_tps for r in results if r.stats.decode_tps is not None]
    return {"model": model, "ranks": ranks.size if ranks else 1, "split": "layers" if ranks and ranks.pipeline else
            ("heads" if ranks else "–"), "ttft_s": statistics.median(ttft) if ttft else None,
            "decode_tps": statistics.median(tps) if tps else None, "peaks_mb": peaks,
            "answers": [r.text for r in results], "load_s": server.load_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    rows = [measure(model, ranks, args.turns, args.max_tokens) for model, ranks in SETTINGS]
    single = {r["model"]: r for r in rows if r["ranks"] == 1}
    print(f"measured on {collect().hardware_label}; every rank on this one machine (loopback ring)\n")
    print("| model | ranks | split | TTFT med | ×1 rank | decode tok/s med | ×1 rank | peak RSS each rank (MB) | "
          "largest ÷ 1 rank | answers as 1 rank |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        one = single[r["model"]]
        peaks = [p for p in r["peaks_mb"] if p is not None]
        print(f"| {r['model']} | {r['ranks']} | {r['split']} | {r['ttft_s']:.3f}s | {r['ttft_s'] / one['ttft_s']:.2f} | "
              f"{r['decode_tps']:.1f} | {r['decode_tps'] / one['decode_tps']:.2f} | "
              f"{', '.join(f'{p:.0f}' for p in peaks)} | {max(peaks) / max(one['peaks_mb']):.2f} | "
              f"{'same' if r['answers'] == one['answers'] else 'DIFFERENT'} |")
    print("\nEstimate, not a measurement: on two Macs over Thunderbolt each rank has a whole machine's cores and "
          "memory bandwidth; tensor parallelism adds two all-reduces a layer per token (~tens of µs each on "
          "Thunderbolt 5 RDMA with jaccl, more over TCP), so a model that fits one Mac decodes slower on two, and "
          "one that does not fit one Mac becomes possible at all.")


if __name__ == "__main__":
    main()
