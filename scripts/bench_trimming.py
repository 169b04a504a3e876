"""Trimming one turn at a time vs in big steps: prefilled tokens and TTFT per turn of a long chat.

    uv run python scripts/bench_trimming.py                      # the demo model, budget 200, 30 turns
    uv run python scripts/bench_trimming.py --model smollm2 --budget 600

Both conversations run side by side in one process (the same model, each with its own KV cache),
their turns alternating, so that the machine's noise falls on both. At a token budget, dropping
the oldest turn each request changes the prompt right after the system message: every later turn
re-prefills the whole budget. Dropping down to ``--trim-to`` of it at once lets the turns after a
trim reuse the cache until the budget is reached again. Steady state: from the first trim on.
Target: big steps prefill ≤ 0.4× the tokens of one-at-a-time per turn, on average.
"""

from __future__ import annotations

import argparse
import statistics

from localchat.backends import GenerationParams
from localchat.backends.inproc import load_inproc
from localchat.conversation.history import Conversation
from localchat.conversation.settings import TrimPolicy
from localchat.conversation.turn import ChatSession
from localchat.environment import collect
from localchat.registry import local_dir, resolve

QUESTIONS = ["Remember the code harbor 17. Reply only OK.", "Hello", "How are you?", "What is your name?",
             "Nice weather today.", "Tell me a joke.", "Thanks", "Good morning", "What can you do?",
             "Are you a real assistant?", "What time is it?", "Hi", "Goodbye"]


def session(model, tokenizer, name: str, budget: int, trim_to: float, max_tokens: int) -> ChatSession:
    from localchat.backends.inproc import InProcessBackend

    return ChatSession(InProcessBackend(model, tokenizer, name), Conversation(resolve(name).default("system")),
                       GenerationParams(max_tokens=max_tokens),
                       trim=TrimPolicy(max_context_tokens=budget, trim_to=trim_to))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="demo")
    p.add_argument("--budget", type=int, default=200)
    p.add_argument("--turns", type=int, default=30)
    p.add_argument("--trim-to", type=float, default=0.5)
    p.add_argument("--max-tokens", type=int, default=32)
    args = p.parse_args()
    ref = resolve(args.model)
    loaded = load_inproc(ref, local_dir(ref))
    sessions = {name: session(loaded.model, loaded.tokenizer, ref.id, args.budget, trim_to, args.max_tokens)
                for name, trim_to in (("one at a time", 1.0), ("big steps", args.trim_to))}
    sessions["one at a time"].ask("Hello")  # warm-up, then forget it
    sessions["one at a time"].conversation.reset()
    rows: dict[str, list[tuple[int, int, float, int]]] = {name: [] for name in sessions}
    for turn in range(args.turns):
        question = QUESTIONS[turn % len(QUESTIONS)]
        for name, chat in sessions.items():
            s = chat.ask(question)
            rows[name].append((s.stats.prompt_tokens, s.stats.prompt_tokens - s.stats.cached_tokens,
                               s.stats.ttft_s or 0.0, s.dropped_turns))
    print(f"{ref.id} on {collect().hardware_label}; budget {args.budget} tokens, "
          f"big steps down to {args.trim_to:g} of it")
    print("turn | one at a time: prompt, prefilled, TTFT ms, dropped | big steps: prompt, prefilled, TTFT ms, dropped")
    for i, (a, b) in enumerate(zip(*rows.values()), 1):
        cells = [f"{r[0]:4d} {r[1]:4d} {r[2] * 1e3:7.1f} {r[3]:2d}" for r in (a, b)]
        print(f"{i:4d} | {cells[0]} | {cells[1]}")
    start = min(next((i for i, r in enumerate(rows_) if r[3]), len(rows_)) for rows_ in rows.values())
    steady = {name: rows_[start:] for name, rows_ in rows.items()}
    one, big = steady["one at a time"], steady["big steps"]
    ratio = statistics.fmean(r[1] for r in big) / statistics.fmean(r[1] for r in one)
    ttft = statistics.median(r[2] for r in big) / statistics.median(r[2] for r in one)
    print(f"steady state (turn {start + 1} on): mean prefilled tokens a turn {statistics.fmean(r[1] for r in one):.1f} "
          f"one at a time vs {statistics.fmean(r[1] for r in big):.1f} in big steps: ×{ratio:.2f} (target ≤ 0.40); "
          f"median TTFT ×{ttft:.2f}; trims {sum(bool(r[3]) for r in one)} vs {sum(bool(r[3]) for r in big)}")


if __name__ == "__main__":
    main()
