"""Does rendering Markdown as the answer streams slow decoding?

    uv run python scripts/bench_markdown.py [--tokens 512] [--pairs 5] [--model PATH]

One process, one model, the same greedy turn played by ``ChatSession`` with the terminal UI's
listeners: raw text to a null file (``--plain``, or a pipe) against Markdown rendered on a forced
terminal of 100×40 (what a user's terminal gets), alternating A B A B. Decode speed is the one
clock's (completion tokens − 1) / (last − first text). The default model is a random-weight toy
that rambles to the token limit at hundreds of tokens a second: the worst case for a renderer,
whose cost per token matters most when tokens are cheap. Target: markdown ≥ 0.98× plain.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from rich.console import Console

from demo.random_model import build_random_model
from localchat.backends import GenerationParams
from localchat.backends.inproc import InProcessBackend
from localchat.cli.markdown import MarkdownStream
from localchat.cli.render import ChatUI
from localchat.conversation.history import Conversation
from localchat.conversation.turn import ChatSession
from localchat.environment import collect

MODEL = Path(tempfile.gettempdir()) / "localchat-bench-models" / "rambling-128"


def ui(markdown: bool, sink) -> ChatUI:
    chat_ui = ChatUI(out=sink, err=Console(file=sink), show_stats=False)
    if markdown:
        chat_ui.markdown = MarkdownStream(Console(file=sink, force_terminal=True, width=100, height=40))
    return chat_ui


def decode_tps(backend: InProcessBackend, markdown: bool, tokens: int, sink) -> float:
    session = ChatSession(backend, Conversation(None), GenerationParams(max_tokens=tokens), use_history=False)
    shown = ui(markdown, sink)
    result = session.ask("Write a long answer with headings, lists and code.", shown.listeners())
    shown.end_turn(result, tokens)
    return result.stats.decode_tps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--model", type=Path, default=None, help="an MLX model directory [default: a rambling toy]")
    args = p.parse_args()
    from mlx_lm import load

    path = args.model or (MODEL if (MODEL / "config.json").exists() else
                          build_random_model(MODEL, hidden=128, layers=2, intermediate=256, heads=4))
    model, tokenizer = load(str(path))
    backend = InProcessBackend(model, tokenizer, path.name, cache_reuse=False)
    figures: dict[bool, list[float]] = {False: [], True: []}
    with open(os.devnull, "w") as sink:
        decode_tps(backend, False, 32, sink)  # warm-up
        for _ in range(args.pairs):
            for markdown in (False, True):
                figures[markdown].append(decode_tps(backend, markdown, args.tokens, sink))
    plain, rendered = statistics.median(figures[False]), statistics.median(figures[True])
    print(f"{path.name} on {collect().hardware_label}: {args.tokens} tokens a turn, {args.pairs} pairs")
    print(f"decode tok/s, median: plain {plain:.1f}, markdown {rendered:.1f}: ×{rendered / plain:.3f} "
          "(target ≥ 0.98)")
    print("each pair (plain, markdown): " + ", ".join(f"({a:.0f}, {b:.0f})" for a, b in zip(*figures.values())))


if __name__ == "__main__":
    main()
