"""What does localchat's in-process backend cost over raw mlx_lm? And what does KV reuse buy?

    uv run python scripts/bench_overhead.py [--pairs 5] [--tokens 64] [--quick]
    uv run python scripts/bench_overhead.py --model smollm2 [--turn-tokens 100]

1. Raw ``mlx_lm.stream_generate`` vs localchat (ChatSession → InProcessBackend → TurnClock),
   in pairs in ABBA order after a warm-up of both, same prompt, temperature 0, on a mid-size
   random-weight model (so the model dominates): median decode tok/s and TTFT of each, and the
   median of the pairs' ratios; ``--runs N`` repeats it and counts the runs within target.
2. History growth: an 8-turn conversation (+~200 prompt tokens a turn), TTFT per turn with KV
   reuse, with mlx_lm's own chat loop (the runtime's floor), and with --no-cache-reuse.

``--model`` measures a real model instead (a models.yaml id such as ``smollm2``, or a directory):
its own weights for ``q4`` and a bfloat16 copy (dequantized with mlx_lm's convert) for ``bf16``.
Models are built once and cached in a temp dir. On Linux the mlx[cpu] wheel uses a reference
BLAS, so bf16 stands in for fp16 and 4-bit weights keep fp32 scales (fp16 is far slower there).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from demo.random_model import build_random_model
from localchat.backends import GenerationParams
from localchat.backends.inproc import InProcessBackend
from localchat.conversation.history import Conversation, Turn
from localchat.conversation.turn import ChatSession
from localchat.environment import collect

CACHE = Path(tempfile.gettempdir()) / "localchat-bench-models"
SIZES = {  # ~57M parameters: big enough that the model, not Python, dominates
    "full": dict(hidden=768, layers=8, intermediate=2048, heads=12, kv_heads=4),
    "quick": dict(hidden=256, layers=4, intermediate=768, heads=4, kv_heads=4),
}
PROMPT = ("Summarise the following notes in one line: the harbour opens at nine, the ferry to the "
          "island leaves every forty minutes, and the last boat back is at six.")
SYSTEM = "You are a helpful assistant."
FILLER = ("Here is another paragraph of meeting notes about schedules, rooms, people and small "
          "decisions, added so that each turn grows the history by about two hundred tokens. ")


def model_dir(variant: str, size: str, model: str | None = None) -> Path:
    if model:
        return real_model_dir(variant, model)
    path = CACHE / f"{size}-{variant}"
    if not (path / "config.json").exists():
        print(f"building the {size} random-weight model ({variant}) in {path} …", flush=True)
        if variant == "bf16":
            build_random_model(path, **SIZES[size], dtype="bfloat16")
        else:
            build_random_model(path, **SIZES[size], dtype="float32", quantize_bits=4)
    return path


def real_model_dir(variant: str, model: str) -> Path:
    """A registry model as it is (``q4``: its own quantization), or a bfloat16 copy of it."""
    from localchat.registry import local_dir, resolve

    path = local_dir(resolve(model))
    if variant != "bf16":
        return path
    copy = CACHE / f"{path.name}-bf16"
    if not (copy / "config.json").exists():
        from mlx_lm import convert

        print(f"dequantizing {path} to bfloat16 in {copy} …", flush=True)
        convert(str(path), str(copy), dequantize=True, dtype="bfloat16")
    return copy


def raw_run(model, tokenizer, messages, max_tokens: int) -> tuple[float, float]:
    """TTFT and decode tok/s of plain mlx_lm, timed the way localchat times (from submission)."""
    from mlx_lm import stream_generate

    start = time.perf_counter()
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    first, last, n = time_stream(stream_generate(model, tokenizer, prompt, max_tokens=max_tokens))
    return first - start, (n - 1) / (last - first)


def time_stream(responses) -> tuple[float, float, int]:
    """Clock times of the first and last visible text of an mlx_lm stream, and its token count."""
    first = last = None
    n = 0
    for response in responses:
        if response.text:
            last = time.perf_counter()
            first = first or last
        n = response.generation_tokens
    return first, last, n


def localchat_run(backend, messages, max_tokens: int) -> tuple[float, float]:
    session = ChatSession(backend, Conversation(), GenerationParams(max_tokens=max_tokens), use_history=False)
    stats = session.ask(messages[-1]["content"]).stats
    return stats.ttft_s, stats.decode_tps


def ab_compare(path: Path, pairs: int, max_tokens: int) -> dict:
    """Alternating pairs in ABBA order (raw leads every other pair, so neither arm always runs
    on the heels of the other), after a warm-up of both; medians, and the median of the pairs'
    own ratios (a slow spell of the machine hits both runs of a pair alike)."""
    from mlx_lm import load

    model, tokenizer = load(str(path))
    backend = InProcessBackend(model, tokenizer, path.name, cache_reuse=False)
    messages = [{"role": "user", "content": PROMPT}]
    arms = {"raw": lambda: raw_run(model, tokenizer, messages, max_tokens),
            "ours": lambda: localchat_run(backend, messages, max_tokens)}
    for arm in arms.values():  # warm-up both paths
        arm()
    runs = {"raw": [], "ours": []}
    for i in range(pairs):
        for name in ("raw", "ours") if i % 2 == 0 else ("ours", "raw"):
            runs[name].append(arms[name]())
    raw, ours = runs["raw"], runs["ours"]
    med = statistics.median
    return {"raw_ttft": med(r[0] for r in raw), "ours_ttft": med(r[0] for r in ours),
            "raw_tps": med(r[1] for r in raw), "ours_tps": med(r[1] for r in ours),
            "tps_ratio": med(o[1] / r[1] for r, o in zip(raw, ours)),
            "ttft_ratio": med(o[0] / r[0] for r, o in zip(raw, ours)),
            "ttft_extra": med(o[0] - r[0] for r, o in zip(raw, ours))}


def within_target(r: dict) -> bool:
    """decode ≥ 0.98× and TTFT ≤ 1.02× + 10 ms, on the pairs' median ratios."""
    return r["tps_ratio"] >= 0.98 and r["ttft_extra"] <= 0.02 * r["raw_ttft"] + 0.010


def grown_prompt(tokenizer, turn: int, tokens: int) -> str:
    """A turn's question: as many filler words as make it ~``tokens`` tokens long (the demo
    tokenizer, which these models reuse, spells ordinary prose in short pieces)."""
    words = (FILLER * 20).split()
    count = 1
    while len(tokenizer.encode(f"Turn {turn}. " + " ".join(words[:count]))) < tokens:
        count += 1
    return f"Turn {turn}. " + " ".join(words[:count])


def growth(model, tokenizer, prompts: list[str], max_tokens: int, reuse: bool) -> list[tuple[float, int]]:
    """TTFT and prefilled tokens per turn of one conversation through localchat, from an empty
    cache, as in a new session."""
    backend = InProcessBackend(model, tokenizer, "bench", cache_reuse=reuse)
    session = ChatSession(backend, Conversation(SYSTEM), GenerationParams(max_tokens=max_tokens))
    turns_seen = []
    for turn, prompt in enumerate(prompts, 1):
        result = session.ask(prompt)
        stats = result.stats
        turns_seen.append((stats.ttft_s, stats.prompt_tokens - stats.cached_tokens))
        _progress("reuse" if reuse else "no reuse", turn, *turns_seen[-1])
        if not result.committed:  # a random model's reply is cut by max_tokens: keep it anyway
            session.conversation.commit(Turn(prompt, result.text))
    return turns_seen


def runtime_growth(model, tokenizer, prompts: list[str], max_tokens: int) -> list[tuple[float, int]]:
    """The same conversation the way mlx_lm's own ``mlx_lm.chat`` runs it: one prompt cache, and
    each turn only the new message templated and prefilled. No history builder, no prefix
    matching: the runtime's floor for a growing conversation, against which localchat's reuse
    arm is read (what is left above 1× here is attention over the longer context)."""
    from mlx_lm import stream_generate
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    turns_seen = []
    for turn, text in enumerate(prompts, 1):
        start = time.perf_counter()
        messages = [{"role": "system", "content": SYSTEM}] if turn == 1 else []
        messages.append({"role": "user", "content": text})
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        first, _, _ = time_stream(stream_generate(model, tokenizer, prompt, max_tokens=max_tokens,
                                                  prompt_cache=cache))
        turns_seen.append((first - start, len(prompt)))
        _progress("mlx_lm.chat", turn, *turns_seen[-1])
    return turns_seen


def per_turn_median(runs: list[list[tuple[float, int]]]) -> list[tuple[float, int]]:
    return [(statistics.median(r[i][0] for r in runs), runs[0][i][1]) for i in range(len(runs[0]))]


def _progress(arm: str, turn: int, ttft_s: float, prefilled: int) -> None:
    """The 57M no-reuse arm takes minutes on a CPU: show each turn as it ends."""
    print(f"  {arm} turn {turn}: TTFT {ttft_s * 1e3:.1f} ms, prefilled {prefilled} tokens", flush=True)


def print_growth(label: str, arms: dict[str, list[tuple[float, int]]]) -> None:
    turns = len(next(iter(arms.values())))
    print(f"\n[{label}] history growth: TTFT per turn (ms)")
    print("  turn              " + " ".join(f"{i:>7}" for i in range(1, turns + 1)))
    for arm, seen in arms.items():
        print(f"  {arm:<17} " + " ".join(f"{ttft * 1e3:7.1f}" for ttft, _ in seen))
        print(f"  {'  prefilled':<17} " + " ".join(f"{n:7d}" for _, n in seen))
    ratios = ", ".join(f"{arm} {seen[-1][0] / seen[0][0]:.2f}×" for arm, seen in arms.items())
    print(f"  turn {turns} / turn 1: {ratios}  (target: localchat reuse within 5 % of mlx_lm.chat)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--runs", type=int, default=1, help="repeat the A/B part (each run: new pairs)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens generated per run")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="a small model (for a fast look)")
    parser.add_argument("--variants", default="bf16,q4",
                        help="models for the A/B part (comma-separated; empty: growth part only)")
    parser.add_argument("--growth-repeats", type=int, default=3,
                        help="runs of the reuse arms (per-turn median); the slow no-reuse arm runs once")
    parser.add_argument("--growth-variant", default="bf16",
                        help="model for the growth part (the CPU wheel's 4-bit prefill is very slow)")
    parser.add_argument("--model", help="a real model (models.yaml id or directory) instead of random weights")
    parser.add_argument("--turn-tokens", type=int, default=200, help="prompt tokens each growth turn adds")
    parser.add_argument("--no-growth", action="store_true", help="the A/B part only")
    args = parser.parse_args()
    size = "quick" if args.quick else "full"
    env = collect()
    print(f"hardware: {env.hardware_label} · mlx {env.mlx_version} · mlx-lm {env.mlx_lm_version}")
    for variant in filter(None, args.variants.split(",")):
        path = model_dir(variant, size, args.model)
        met = 0
        for run in range(1, args.runs + 1):
            r = ab_compare(path, args.pairs, args.tokens)
            met += within_target(r)
            print(f"\n[{args.model or size} {variant}, run {run}/{args.runs}] raw mlx_lm vs localchat, "
                  f"{args.pairs} pairs in ABBA order, medians")
            print(f"  decode tok/s  raw {r['raw_tps']:8.1f}   localchat {r['ours_tps']:8.1f}   "
                  f"paired ratio {r['tps_ratio']:.3f}  (target ≥ 0.98)")
            print(f"  TTFT          raw {r['raw_ttft'] * 1e3:7.1f}ms  localchat {r['ours_ttft'] * 1e3:7.1f}ms  "
                  f"paired ratio {r['ttft_ratio']:.3f}, {r['ttft_extra'] * 1e3:+.1f} ms "
                  "(target ≤ 1.02× + 10 ms)", flush=True)
        print(f"  [{args.model or size} {variant}] within target in {met} of {args.runs} runs")
    if args.no_growth:
        return
    from mlx_lm import load

    model, tokenizer = load(str(model_dir(args.growth_variant, size, args.model)))
    prompts = [grown_prompt(tokenizer, turn, args.turn_tokens) for turn in range(1, args.turns + 1)]
    warm_up = ChatSession(InProcessBackend(model, tokenizer, "bench"), Conversation(SYSTEM),
                          GenerationParams(max_tokens=16))
    warm_up.ask(prompts[0])  # mlx and the template, at a real turn's shape; its cache is not reused
    reuse_runs, runtime_runs = [], []
    for _ in range(args.growth_repeats):  # alternate the two close arms, as in the A/B part
        reuse_runs.append(growth(model, tokenizer, prompts, 16, reuse=True))
        runtime_runs.append(runtime_growth(model, tokenizer, prompts, 16))
    arms = {"localchat reuse": per_turn_median(reuse_runs),
            "mlx_lm.chat": per_turn_median(runtime_runs),
            "localchat no reuse": growth(model, tokenizer, prompts, 16, reuse=False)}
    print_growth(f"{args.model or size} {args.growth_variant}, reuse arms: median of {args.growth_repeats} runs, "
                 f"+~{args.turn_tokens} prompt tokens a turn", arms)


if __name__ == "__main__":
    main()
