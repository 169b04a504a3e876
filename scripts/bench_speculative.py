"""What does speculative decoding (``--draft-model``) buy, in-process?

    uv run python scripts/bench_speculative.py [--model demo] [--pairs 3] [--tokens 64]

One process, the same greedy multi-turn conversation played by ``ChatSession`` without a draft and
with each draft, alternating: decode tok/s (the one clock's), the share of generated tokens that
came from the draft (mlx_lm's ``from_draft``), and whether the answers are identical (they must
be: speculation never changes greedy tokens). A model drafting for itself accepts every token it
can: its acceptance is the ceiling and its speed the pure overhead of drafting. Then a sibling
with the same tokenizer (demo-notes for demo) and, with ``--draft-tokens``, other step sizes.
"""

from __future__ import annotations

import argparse
import statistics

from localchat.backends import GenerationParams
from localchat.backends.inproc import InProcessBackend, load_inproc
from localchat.backends.mlx_options import RuntimeOptions
from localchat.conversation.history import Conversation
from localchat.conversation.turn import ChatSession
from localchat.environment import collect
from localchat.registry import local_dir, resolve

QUESTIONS = ["Remember the code harbor 17. Reply only OK.", "Hello", "How are you?", "Tell me a joke.",
             "What was the code? Reply with the code only.", "What can you do?"]


def play(backend: InProcessBackend, tokens: int) -> tuple[float, float | None, list[str]]:
    """Median decode tok/s, the drafted share, and the answers of one conversation."""
    session = ChatSession(backend, Conversation("You are a helpful assistant."), GenerationParams(max_tokens=tokens))
    results = [session.ask(q) for q in QUESTIONS]
    speeds = [r.stats.decode_tps for r in results if r.stats.decode_tps]
    return statistics.median(speeds), session.ledger.summary()["draft_share"], [r.text for r in results]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="demo")
    p.add_argument("--drafts", default="demo,demo-notes", help="draft models, comma-separated")
    p.add_argument("--draft-tokens", default="3", help="tokens drafted a step, comma-separated")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64)
    args = p.parse_args()
    ref = resolve(args.model)
    arms = {"no draft": load_inproc(ref, local_dir(ref))}
    for draft in args.drafts.split(","):
        for k in map(int, args.draft_tokens.split(",")):
            arms[f"{draft} drafting {k}"] = load_inproc(ref, local_dir(ref),
                                                        options=RuntimeOptions(draft_model=draft, num_draft_tokens=k))
    for backend in arms.values():
        play(backend, 8)  # warm-up
    runs: dict[str, list[tuple[float, float | None, list[str]]]] = {name: [] for name in arms}
    for _ in range(args.pairs):
        for name, backend in arms.items():
            backend.close()
            runs[name].append(play(backend, args.tokens))
    base_speed = statistics.median(r[0] for r in runs["no draft"])
    base_answers = runs["no draft"][0][2]
    print(f"{ref.id} on {collect().hardware_label}; {len(QUESTIONS)} greedy turns, {args.pairs} runs an arm")
    for name, figures in runs.items():
        speed = statistics.median(r[0] for r in figures)
        share = figures[0][1]
        same = all(r[2] == base_answers for r in figures)
        drafted = f"drafted {share:.0%} of tokens" if share is not None else "no draft"
        print(f"{name:>22}: decode {speed:7.1f} tok/s (×{speed / base_speed:.2f}), {drafted}, "
              f"answers {'identical' if same else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
