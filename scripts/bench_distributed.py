"""What serving from several ranks costs and saves on this machine, measured side by side in one run.

    uv run python scripts/bench_distributed.py [--turns 3] [--max-tokens 48]

For each setting (the demo on 1, 2 and 3 ranks; SmolLM2 on 1 and 3), ``localchat serve``'s own launcher starts
the server (mlx.launch for ranks > 1, ring over loopback), the same greedy conversation is played through
localchat's HTTP backend, and the one clock gives TTFT and decode tok/s; each process's peak resident memory
(``VmHWM``) is read before it stops. The demo has 4 heads and is a llama, which mlx_lm 0.32 splits by heads
only: 3 ranks are refused (the row says why) and 4 are measured instead; SmolLM2 has 9 heads and 3 KV heads,
so 3 ranks split heads. On one 2-core machine more ranks are slower: they share two cores, and mlx.launch's
own I/O loop keeps one of them busy. What a Thunderbolt pair of Macs would change is an estimate, printed as
one.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

from localchat.backends import GenerationParams
from localchat.backends.openai_http import backend_for
from localchat.conversation.history import Conversation
from localchat.conversation.turn import ChatSession
from localchat.environment import collect
from localchat.errors import UsageError
from localchat.registry import resolve
from localchat.server.distributed import Ranks, check_ranks
from localchat.server.launch import free_port, start_ready

QUESTIONS = ["Remember the code harbor 17. Reply only OK.", "Tell me about the weather today.",
             "What was the code? Reply with the code only."]
SETTINGS = [("demo", None), ("demo", Ranks(count=2)), ("demo", Ranks(count=3)), ("demo", Ranks(count=4)),
            ("smollm2", None), ("smollm2", Ranks(count=3))]


def peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def server_processes(leader: int, ranked: bool) -> list[int]:
    """The mlx_lm.server processes: ``leader`` itself, or the ranks mlx.launch (``leader``) started
    (``MLX_RANK`` set; the launcher, ~22 MB here, is not a rank)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command, env = (entry / "cmdline").read_bytes(), (entry / "environ").read_bytes()
        except OSError:
            continue
        ours = int(stat[3]) == leader and b"MLX_RANK=" in env if ranked else int(entry.name) == leader
        if ours and b"mlx_lm\x00server" in command:
            found.append(int(entry.name))
    return sorted(found)


def runtime_mb() -> float:
    """Peak resident memory of Python with mlx_lm.server imported and MLX started, no model: what
    every rank holds before its share of the weights."""
    code = ("import mlx.core as mx, mlx_lm.server; mx.eval(mx.ones(4) + 1); "
            "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')))")
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout) / 1024


def measure(model: str, ranks: Ranks | None, turns: int, max_tokens: int) -> dict:
    ref = resolve(model)
    if ranks:
        try:
            check_ranks(ranks, Path(ref.location))
        except UsageError as refused:
            return {"model": model, "ranks": ranks.size, "refused": str(refused)}
    server = start_ready(ref, port=free_port(), ranks=ranks, log=Path(f"/tmp/bench-distributed-{model}.log"))
    try:
        backend = backend_for(server.base_url, ref)
        chat = ChatSession(backend, Conversation.for_backend(backend, ref.default("system")),
                           GenerationParams(max_tokens=max_tokens, seed=0)).prepare()
        results = [chat.ask(q) for q in QUESTIONS[:turns]]
        backend.close()
        peaks = [peak_rss_mb(pid) for pid in server_processes(server.process.pid, ranks is not None)]
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
    base = runtime_mb()
    print(f"measured on {collect().hardware_label}; every rank on this one machine (loopback ring); "
          f"Python + MLX + mlx_lm.server with no model: {base:.0f} MB\n")
    print("| model | ranks | split | TTFT med | ×1 rank | decode tok/s med | ×1 rank | peak RSS each rank (MB) | "
          "largest above the runtime ÷ 1 rank | answers as 1 rank |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        one = single[r["model"]]
        if "refused" in r:
            print(f"| {r['model']} | {r['ranks']} | refused before launch: {r['refused']} |" + " |" * 7)
            continue
        peaks = [p for p in r["peaks_mb"] if p is not None]
        print(f"| {r['model']} | {r['ranks']} | {r['split']} | {r['ttft_s']:.3f}s | {r['ttft_s'] / one['ttft_s']:.2f} "
              "| "
              f"{r['decode_tps']:.1f} | {r['decode_tps'] / one['decode_tps']:.2f} | "
              f"{', '.join(f'{p:.0f}' for p in peaks)} | {(max(peaks) - base) / (max(one['peaks_mb']) - base):.2f} | "
              f"{'same' if r['answers'] == one['answers'] else 'DIFFERENT'} |")
    print("\nEstimate, not a measurement: on two Macs over Thunderbolt each rank has a whole machine's cores and "
          "memory bandwidth; tensor parallelism adds two all-reduces a layer per token (~tens of µs each on "
          "Thunderbolt 5 RDMA with jaccl, more over TCP), so a model that fits one Mac decodes slower on two, and "
          "one that does not fit one Mac becomes possible at all.")


if __name__ == "__main__":
    main()
