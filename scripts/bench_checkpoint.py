"""What does the end-of-prompt checkpoint buy a model whose KV cache cannot be trimmed?

    uv run python scripts/bench_checkpoint.py [--turns 6] [--turn-tokens 200] [--pairs 3]

A thinking model's template drops each turn's reasoning from the next prompt, so the cache holds
tokens the next prompt does not share. A trimmable cache is cut back; a hybrid model's cache
(here a random-weight lfm2: convolution layers with mlx_lm's ``ArraysCache``, plus attention)
cannot be, and without a checkpoint the whole history is prefilled again every turn. Each turn
here commits an answer other than the text generated, which is exactly that situation.

Both arms play the same conversation through ``InProcessBackend`` and the one clock
(``TurnClock``), alternating A B A B; printed: per turn, the tokens prefilled and the median
TTFT of each arm, and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from demo.random_model import build_hybrid_model
from localchat.backends import Finished, GenerationParams, TextChunk
from localchat.backends.inproc import InProcessBackend
from localchat.conversation.history import build_messages
from localchat.conversation.stats import TurnClock
from localchat.environment import collect

MODEL = Path(tempfile.gettempdir()) / "localchat-bench-models" / "hybrid-lfm2-256"
SIZE = dict(hidden=256, layers=6, heads=4)
FILLER = "Notes on rooms, ferries and small decisions, added so that every turn grows the history. "


def play(backend: InProcessBackend, turns: int, turn_tokens: int) -> list[tuple[int, float]]:
    """(tokens prefilled, TTFT) for each turn of one conversation."""
    history: list[dict[str, str]] = []
    figures = []
    for n in range(turns):
        user = f"Turn {n}. " + FILLER * max(1, turn_tokens // 18)
        messages = build_messages(user, "You are a helpful assistant.", history)
        clock, done = TurnClock(), None
        for event in backend.stream(messages, GenerationParams(max_tokens=8)):
            if isinstance(event, TextChunk):
                clock.on_text(event.text or " ")
            elif isinstance(event, Finished):
                done = event
        stats = clock.finish(done)
        figures.append((stats.prompt_tokens - stats.cached_tokens, stats.ttft_s))
        history += [{"role": "user", "content": user}, {"role": "assistant", "content": "Noted."}]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--turn-tokens", type=int, default=200)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    from mlx_lm import load

    if not (MODEL / "config.json").exists():
        build_hybrid_model(MODEL, **SIZE)
    model, tokenizer = load(str(MODEL))
    runs: dict[bool, list[list[tuple[int, float]]]] = {True: [], False: []}
    play(InProcessBackend(model, tokenizer, "hybrid"), 2, args.turn_tokens)  # warm-up
    for _ in range(args.pairs):
        for checkpoints in (True, False):
            backend = InProcessBackend(model, tokenizer, "hybrid", checkpoints=checkpoints)
            runs[checkpoints].append(play(backend, args.turns, args.turn_tokens))
    print(f"hybrid lfm2 (random weights, {SIZE['hidden']} hidden, {SIZE['layers']} layers) on "
          f"{collect().hardware_label}; "
          f"median of {args.pairs} alternating pairs")
    print("turn | prefilled with | prefilled without | TTFT with ms | TTFT without ms | TTFT ratio")
    for n in range(args.turns):
        with_cp = [run[n] for run in runs[True]]
        without = [run[n] for run in runs[False]]
        ttft_with = statistics.median(t for _, t in with_cp)
        ttft_without = statistics.median(t for _, t in without)
        print(f"{n + 1:>4} | {with_cp[0][0]:>14} | {without[0][0]:>17} | {ttft_with * 1e3:>12.1f} | "
              f"{ttft_without * 1e3:>15.1f} | {ttft_with / ttft_without:.2f}×")


if __name__ == "__main__":
    main()
