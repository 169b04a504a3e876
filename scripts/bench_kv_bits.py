"""What ``serve --kv-bits`` saves and what it costs, side by side in one run.

    uv run python scripts/bench_kv_bits.py [--models smollm2,demo] [--tokens 64] [--prompt-tokens 2000]

For each model, four arms, each a ``serve`` of its own (no disk tier, so every prompt is prefilled):
our engine at 16 bits (the model's own float), 8 and 4 bits (``--kv-bits``), and mlx_lm.server as it is
with ``--kv-bits 8`` (``serve --plain --kv-bits 8``: mlx_lm serves one request at a time then). Each arm
answers 1 user, then 4 users at once, each user a prompt of its own of ``--prompt-tokens`` tokens
(the demo's window is 1,024 tokens: its prompts are 900 at most) and ``--tokens`` greedy tokens with the
end token banned (every reply the same length; the demo's 320 at least, so that its decode can be
timed). On this Linux CPU a 2k-token prefill of SmolLM2 takes minutes (a reference BLAS), so the run
in docs/kv-cache.md used ``--prompt-tokens 512``.

Printed, a row an arm and load: KV bytes per token (measured in-process on the engine's own cache
classes after a prefill of 256 tokens: mlx_lm's ``QuantizedKVCache`` for the plain arm), the
engine's peak resident memory (sampled from /proc every 20 ms), TTFT p50/p95, aggregate decode tok/s
(all tokens after each user's first, over the span from the first user's first token to the last
user's last) and per-user decode tok/s (median). Targets: KV bytes per token ≤ 0.55× of 16-bit at
8 bits and ≤ 0.30× at 4 bits; at 4 users with 8 bits, aggregate decode ≥ 2× mlx_lm.server's
``--kv-bits 8`` and ≥ 0.8× our own 16-bit batch. ``--plot FILE`` draws the decode figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from localchat.environment import collect
from localchat.processes import resident_bytes
from localchat.serve.started import StartedServe

ARMS = (("ours 16-bit", ()), ("ours 8-bit", ("--kv-bits", "8")), ("ours 4-bit", ("--kv-bits", "4")),
        ("mlx_lm.server --kv-bits 8", ("--plain", "--kv-bits", "8")))
DEMO_PROMPT_TOKENS = 900
DEMO_REPLY_TOKENS = 320  # the toy decodes ~400 tok/s here: a 64-token reply is over before it can be timed


@dataclass(frozen=True)
class Reply:
    ttft: float
    first: float
    last: float
    tokens: int


def prompt_of(tokenizer, user: int, tokens: int) -> str:
    """A prompt of about ``tokens`` tokens whose first words differ by user (no shared prefix)."""
    words = [f"user{user} note{(i * 7 + user) % 101} says {(i * 13 + user) % 17}." for i in range(tokens)]
    text = ""
    for word in words:
        if len(tokenizer.encode(text + word)) > tokens - 24:
            break
        text += word + " "
    return text + "What does note5 say?"


def ask(url: str, model: str, prompt: str, max_tokens: int, banned: tuple[int, ...]) -> Reply:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
            "logit_bias": {str(t): -1000 for t in banned}}
    started, first, last, tokens, said = time.perf_counter(), None, None, 0, ""
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=1800) as response:
        for line in response.iter_lines():
            said = line or said
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                last = time.perf_counter()
                first = first or last
    assert first is not None and last is not None, f"no text came (HTTP {response.status_code}: {said[:300]})"
    return Reply(ttft=first - started, first=first, last=last, tokens=tokens)


class PeakResident:
    """The engine child's resident memory, sampled until stopped; its peak."""

    def __init__(self, pid: int):
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, resident_bytes(self.pid) or 0)
            time.sleep(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def users(url: str, model: str, prompts: list[str], max_tokens: int, banned: tuple[int, ...]) -> list[Reply]:
    replies: list[Reply | None] = [None] * len(prompts)

    def one(i: int) -> None:
        replies[i] = ask(url, model, prompts[i], max_tokens, banned)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(replies), "a user got no reply"
    return [r for r in replies if r is not None]


def figures(replies: list[Reply]) -> dict[str, float]:
    ttfts = sorted(r.ttft for r in replies)
    span = max(r.last for r in replies) - min(r.first for r in replies)
    decoded = sum(r.tokens - 1 for r in replies)
    per_user = [(r.tokens - 1) / (r.last - r.first) for r in replies if r.last > r.first]
    return {"ttft_p50": statistics.median(ttfts), "ttft_p95": ttfts[min(len(ttfts) - 1, round(0.95 * len(ttfts)))],
            "aggregate": decoded / span if span > 0 else float("nan"),
            "per_user": statistics.median(per_user) if per_user else float("nan")}


def kv_bytes_per_token(path: Path, bits: int | None, plain: bool) -> float:
    """The KV cache's bytes a token after a prefill: our engine's caches, or mlx_lm's
    ``QuantizedKVCache`` (the plain arm), on the loaded model."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    from localchat.fit.shape import local_shape
    from localchat.serve.engine.quantized_kv import KVQuantization, quantizing
    from localchat.serve.kv_options import group_for

    model, _ = load(str(path))
    group = group_for(local_shape(path).head_dim, None, path.name)
    quantization = KVQuantization(bits=bits, group_size=group) if bits else None
    cache = quantizing(make_prompt_cache, quantization)(model)
    steps = 256  # (one whole allocation step: the bytes held are the bytes used; a token's bytes do not change)
    model(mx.array([[(7 * i) % 500 + 3 for i in range(steps)]]), cache=cache)
    if plain and bits:
        cache = [c.held.to_quantized(group_size=group, bits=bits) if not c.quantized else c.held for c in cache]
    mx.eval([c.state for c in cache])
    return sum(c.nbytes for c in cache) / steps


def run_model(name: str, home: Path, max_tokens: int, prompt_tokens: int, only: str = "") -> list[dict]:
    from mlx_lm.utils import load_tokenizer

    from localchat.registry import local_dir, resolve

    path = local_dir(resolve(name))
    tokenizer = load_tokenizer(path)
    banned = tuple(tokenizer.eos_token_ids)
    length = min(prompt_tokens, DEMO_PROMPT_TOKENS) if name.startswith("demo") else prompt_tokens
    if name.startswith("demo"):
        max_tokens = max(max_tokens, DEMO_REPLY_TOKENS)
    rows = []
    for arm, flags in ARMS:
        if only not in arm:
            continue
        bits = int(flags[flags.index("--kv-bits") + 1]) if "--kv-bits" in flags else None
        per_token = kv_bytes_per_token(path, bits, "--plain" in flags)
        serve = StartedServe(home / f"{name}-{arm.split()[0]}-{bits}", "-m", name, "--prompt-cache-disk", "0", *flags,
                             log=open(home / "serve.log", "a"))
        try:
            assert serve.wait_ready(), serve.out
            pid = serve.held()[0]["pid"]
            ask(serve.url, name, "warm up", 4, ())
            for count in (1, 4):
                prompts = [prompt_of(tokenizer, 100 * count + u, length) for u in range(count)]
                sampler = PeakResident(pid)
                replies = users(serve.url, name, prompts, max_tokens, banned)
                rows.append({"model": name, "arm": arm, "users": count, "bits": bits, "prompt_tokens": length,
                             "kv_bytes_per_token": per_token, "peak_resident": sampler.stop(), **figures(replies)})
                show(rows[-1])
        finally:
            serve.stop()
    return rows


def show(row: dict) -> None:
    print(f"{row['model']:<8} {row['arm']:<26} {row['users']:>5} {row['kv_bytes_per_token']:>10,.0f} "
          f"{row['peak_resident'] / 2**20:>9.0f} {row['ttft_p50']:>8.2f} {row['ttft_p95']:>8.2f} "
          f"{row['aggregate']:>9.1f} {row['per_user']:>9.1f}", flush=True)


def at(rows: list[dict], model: str, arm: str, count: int) -> dict:
    return next(r for r in rows if r["model"] == model and r["arm"] == arm and r["users"] == count)


def verdicts(rows: list[dict]) -> list[str]:
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        full = at(rows, model, "ours 16-bit", 1)["kv_bytes_per_token"]
        for bits, target in ((8, 0.55), (4, 0.30)):
            ratio = at(rows, model, f"ours {bits}-bit", 1)["kv_bytes_per_token"] / full
            lines.append(f"{model}: KV bytes a token at {bits} bits {ratio:.2f}× of unquantized (target ≤ {target}×) "
                         f"{'met' if ratio <= target else 'NOT met'}")
        eight, plain, ours16 = (at(rows, model, a, 4)["aggregate"] for a in ("ours 8-bit", "mlx_lm.server --kv-bits 8",
                                                                 "ours 16-bit"))
        lines.append(f"{model}: 4 users at 8 bits decode {eight / plain:.2f}× mlx_lm.server --kv-bits 8 (target ≥ 2×) "
                     f"{'met' if eight >= 2 * plain else 'NOT met'}; {eight / ours16:.2f}× our 16-bit batch "
                     f"(target ≥ 0.8×) {'met' if eight >= 0.8 * ours16 else 'NOT met'}")
    return lines


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from localchat.plots import finish_figure

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        arms = [a for a, _ in ARMS]
        for offset, count in ((-0.2, 1), (0.2, 4)):
            values = [at(rows, model, a, count)["aggregate"] for a in arms]
            ax.bar([i + offset for i in range(len(arms))], values, width=0.4, label=f"{count} user{'s' * (count > 1)}")
        ax.set_xticks(range(len(arms)), [a.replace("mlx_lm.server ", "mlx_lm.server\n") for a in arms], fontsize=7)
        ax.set_ylabel("aggregate decode tok/s")
        ax.set_title(model, fontsize=9)
    finish_figure(fig, axes[0], f"serve --kv-bits: aggregate decode by arm ({collect().mlx_device}, this machine)")
    fig.savefig(out, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2,demo")
    parser.add_argument("--arms", default="", help="only the arms whose name holds this text")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    env = collect()
    print(f"# {env.chip or env.machine} · {env.os} · MLX on {env.mlx_device} · mlx {env.mlx_version}")
    print(f"{'model':<8} {'arm':<26} {'users':>5} {'KV B/tok':>10} {'peak MiB':>9} {'TTFT p50':>8} {'p95':>8} "
          f"{'agg tok/s':>9} {'user tok/s':>9}")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            rows += run_model(model, Path(tmp), args.tokens, args.prompt_tokens, args.arms)
    for line in verdicts(rows) if not args.arms else []:
        print(line)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
