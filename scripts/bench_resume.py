"""What does a saved KV cache buy when a conversation is resumed?

    uv run python scripts/bench_resume.py [--model smollm2] [--variants bf16,q4] [--lengths 500,1500,3000]

For each model variant and conversation length: a conversation grown to ~N tokens in-process,
saved with its KV cache (``/save``), then the next question's TTFT three ways, alternating, the
median of ``--repeats`` (re-prefilling, which takes minutes at 3,000 tokens on a CPU, runs once):

- warm: in the session that never ended, its cache in memory as the conversation left it (a copy
  taken at the save, put back before each question): the floor;
- resumed with the saved cache: a new backend, the cache loaded from disk (``--resume``);
- resumed without it: a new backend that re-prefills the whole conversation (before this issue).

Also the cache file's size (and per 1,000 tokens) and its load time. Target: the resumed turn
within 1.2× of the warm turn's TTFT. ``q4`` is the registry model's own 4-bit weights, ``bf16``
a dequantized copy (see scripts/bench_overhead.py).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

from bench_overhead import FILLER, real_model_dir

from localchat.backends import GenerationParams
from localchat.backends.inproc import InProcessBackend
from localchat.backends.saved_cache import model_fingerprint
from localchat.conversation.history import Conversation, Turn
from localchat.conversation.turn import ChatSession
from localchat.environment import collect
from localchat.store.kv_files import CacheFiles, human_size
from localchat.store.saved_sessions import SessionSaver, SessionStore
from localchat.store.session_cache import SessionCaches, restore_cache

SYSTEM = "You are a helpful assistant. Answer briefly."
QUESTION = "Question {}: in one sentence, what were these notes about?"
TURN_WORDS = 120  # a long user message per turn; the answers are short (max_tokens)


def grown_session(backend: InProcessBackend, tokens: int) -> ChatSession:
    """A conversation of about ``tokens`` prompt tokens, grown turn by turn as a user would."""
    session = ChatSession(backend, Conversation(SYSTEM), GenerationParams(max_tokens=16))
    words, turn = (FILLER * 40).split(), 0
    while session.count(session.conversation.messages()) < tokens:
        turn += 1
        prompt = f"Note {turn}: " + " ".join(words[turn:turn + TURN_WORDS])
        result = session.ask(prompt)
        if not result.committed:  # cut by max_tokens: keep it anyway, the length is what matters
            session.conversation.commit(Turn(prompt, result.text))
    return session


def ttft(session: ChatSession, repeat: int) -> tuple[float, int]:
    """TTFT of the next question and the tokens it prefilled; a kept turn is then taken back."""
    result = session.ask(QUESTION.format(repeat + 1))
    if result.committed:
        session.conversation.take_back()
    return result.stats.ttft_s, result.stats.prompt_tokens - result.stats.cached_tokens


def measure(model, tokenizer, fingerprint: str, tokens: int, repeats: int, workdir: Path, cold: bool) -> dict:
    def backend() -> InProcessBackend:
        return InProcessBackend(model, tokenizer, "bench", fingerprint=fingerprint)

    live = grown_session(backend(), tokens)
    files = CacheFiles(workdir / "kv")
    saver = SessionSaver(SessionStore(workdir / "sessions.sqlite3"), f"uid-{tokens}", "bench",
                         caches=SessionCaches(files))
    written = saver.save(live, f"s{tokens}").cache
    in_memory = copy.deepcopy(live.backend.held_cache())
    turns = live.conversation.turns
    warm, cached, colds, loads = [], [], [], []
    for repeat in range(repeats):  # the arms alternate; re-prefilling (minutes at 3,000 tokens) runs once
        live.backend.adopt_cache(*copy.deepcopy(in_memory))
        warm.append(ttft(live, repeat))
        resumed = ChatSession(backend(), Conversation(SYSTEM, list(turns)), live.params)
        started = time.perf_counter()
        line = restore_cache(resumed, f"uid-{tokens}", f"s{tokens}", files)
        loads.append(time.perf_counter() - started)
        assert line and line.startswith("KV cache loaded"), line
        cached.append(ttft(resumed, repeat))
        if repeat == 0 and cold:
            colds.append(ttft(ChatSession(backend(), Conversation(SYSTEM, list(turns)), live.params), repeat))
    med = lambda runs: statistics.median(r[0] for r in runs)  # noqa: E731
    return {"tokens": written.tokens, "size": written.size, "load_s": statistics.median(loads),
            "warm": med(warm), "cached": med(cached), "cold": med(colds) if colds else None,
            "prefilled": (warm[0][1], cached[0][1], colds[0][1] if colds else None)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--variants", default="bf16,q4")
    parser.add_argument("--lengths", default="500,1500,3000")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cold-max", type=int, default=10**9,
                        help="re-prefill only conversations up to this many tokens (it takes minutes on a CPU)")
    args = parser.parse_args()
    from mlx_lm import load

    env = collect()
    print(f"hardware: {env.hardware_label} · mlx {env.mlx_version} · mlx-lm {env.mlx_lm_version}")
    print(f"median of {args.repeats} alternating runs; TTFT of the next question after a resume")
    for variant in args.variants.split(","):
        path = real_model_dir(variant, args.model)
        model, tokenizer = load(str(path))
        fingerprint = model_fingerprint(path)
        print(f"\n[{args.model} {variant}]")
        print(f"  {'tokens':>6} {'cache':>9} {'/1k tok':>8} {'load':>7} {'warm':>8} {'resumed':>8} "
              f"{'re-prefill':>10} {'resumed/warm':>12} {'re-prefill/resumed':>18}")
        for tokens in map(int, args.lengths.split(",")):
            with tempfile.TemporaryDirectory() as workdir:
                r = measure(model, tokenizer, fingerprint, tokens, args.repeats, Path(workdir),
                            cold=tokens <= args.cold_max)
            per_k = human_size(r["size"] / r["tokens"] * 1000)
            cold = f"{r['cold'] * 1e3:>8.0f}ms" if r["cold"] else f"{'-':>10}"
            speedup = f"{r['cold'] / r['cached']:>17.1f}×" if r["cold"] else f"{'-':>18}"
            print(f"  {r['tokens']:>6} {human_size(r['size']):>9} {per_k:>8} {r['load_s'] * 1e3:>5.0f}ms "
                  f"{r['warm'] * 1e3:>6.0f}ms {r['cached'] * 1e3:>6.0f}ms {cold} "
                  f"{r['cached'] / r['warm']:>11.2f}× {speedup}   "
                  f"(prefilled {'/'.join(str(n) for n in r['prefilled'] if n is not None)})", flush=True)
    print("\ntarget: resumed within 1.2× of warm")


if __name__ == "__main__":
    main()
