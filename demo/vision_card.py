"""Score ``demo-vision`` on held-out pictures through both backends, and write its card's figures.

    uv run --extra vision python -m demo.vision_card --model localchat/demo_vision_model

Every conversation goes through localchat's own history builder (``Conversation``: the picture a
content part of the user's message) and then through the in-process backend (mlx-vlm in this
process) and through a real ``mlx_vlm.server`` (the HTTP backend), greedy. Pictures are drawn with
a seed the trainer never uses, at sizes from 32 to 1,000 pixels a side (the trainer's go from 48 to
400). The two-turn figure asks about the picture of the first turn in the second ("What colour was
it?"), with the model's own first answer in the history.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from demo.pictures import COLOUR_WAS, COLOURS, SHAPE_WAS, SHAPES, WHAT, draw
from localchat.backends import GenerationParams, TextChunk
from localchat.conversation.history import Conversation, Turn
from localchat.vision.image import Picture, picture_from_bytes

SYSTEM = "You are a helpful assistant."
HELD_OUT_SEED = 20261205


def held_out(n: int, seed: int = HELD_OUT_SEED):
    """``n`` pictures at sizes the trainer never drew as well as those it did."""
    rng = random.Random(seed)
    for _ in range(n):
        picture = draw(rng.choice(list(COLOURS)), rng.choice(SHAPES), rng.randint(32, 1000), rng.randint(32, 1000), rng)
        buffer = io.BytesIO()
        picture.image.save(buffer, format="PNG")
        yield picture, picture_from_bytes(buffer.getvalue(), "held-out.png")


def reply(backend: Any, messages: list[dict]) -> str:
    params = GenerationParams(temperature=0.0, max_tokens=16)
    return "".join(e.text for e in backend.stream(messages, params) if isinstance(e, TextChunk)).strip()


def score(backend: Any, n: int, rng: random.Random) -> dict[str, Any]:
    """One turn (what is in it), and two turns (then its colour or its shape), over ``n`` pictures."""
    one = two = 0
    misses: list[str] = []
    for truth, picture in held_out(n):
        conversation = Conversation(SYSTEM)
        question = rng.choice(WHAT)
        answer = ask(backend, conversation, question, (picture,))
        one += answer == truth.answer
        if answer != truth.answer and len(misses) < 5:
            misses.append(f"{truth.answer} → {answer!r}")
        asks_colour = rng.random() < 0.5
        follow = rng.choice(COLOUR_WAS if asks_colour else SHAPE_WAS)
        two += ask(backend, conversation, follow) == (truth.colour if asks_colour else truth.shape)
    return {"one_turn": one / n, "two_turns": two / n, "pictures": n, "misses": misses}


def ask(backend: Any, conversation: Conversation, question: str, pictures: tuple[Picture, ...] = ()) -> str:
    conversation.attached = pictures
    answer = reply(backend, conversation.preview(question))
    conversation.commit(Turn(question, answer, images=pictures))
    conversation.attached = ()
    return answer


def in_process(model: Path) -> Any:
    from localchat.registry import resolve
    from localchat.vision.backend import load_vision

    return load_vision(resolve(str(model)), model)


def over_http(model: Path, run: Callable[[Any], dict[str, Any]], log: Path) -> dict[str, Any]:
    from localchat.backends.openai_http import backend_for
    from localchat.registry import resolve
    from localchat.server.launch import free_port, start_ready

    ref = resolve(str(model))
    server = start_ready(ref, port=free_port(), log=log)
    try:
        return run(backend_for(server.base_url, ref))
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--pictures", type=int, default=200)
    parser.add_argument("--http-pictures", type=int, default=100)
    args = parser.parse_args(argv)
    started = time.time()
    figures = {"in_process": score(in_process(args.model), args.pictures, random.Random(1))}
    figures["mlx_vlm_server"] = over_http(args.model, lambda b: score(b, args.http_pictures, random.Random(1)),
                                          Path("/tmp") / f"demo-vision-card-{time.time_ns()}.log")
    figures["seconds"] = round(time.time() - started)
    (args.model / "eval.json").write_text(json.dumps(figures, indent=2) + "\n")
    (args.model / "README.md").write_text(card(figures, json.loads((args.model / "training.json").read_text())))
    print(json.dumps(figures, indent=2))


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def card(figures: dict[str, Any], training: dict[str, Any]) -> str:
    """The model card: what the toy is, how it was made, and its held-out figures in both backends."""
    from localchat.environment import collect

    machine = collect()
    rows = "\n".join(f"| {where} | {f['pictures']} | {f['one_turn']:.1%} | {f['two_turns']:.1%} |"
                     for where, f in (("in-process (mlx-vlm)", figures["in_process"]),
                                      ("`mlx_vlm.server` (HTTP)", figures["mlx_vlm_server"])))
    misses = "; ".join(figures["in_process"]["misses"]) or "none"
    argv = training["stages"][0]
    stages = "; then ".join(f"{s['steps']} steps of {s['batch']} conversations at learning rate {s['lr']}"
                            + (f", {s['focus']:.0%} of them one question about one picture" if s["focus"] else "")
                            for s in training["stages"])
    seconds = sum(s["train_seconds"] for s in training["stages"])
    return f"""# demo-vision: a toy that really looks

A **toy** vision-language model, bundled so that image chat can be tried and tested offline. It is
mlx-vlm's own `idefics3` architecture (SmolVLM's): a {argv['vision_layers']}-layer ViT (hidden
{argv['vision_hidden']}, 16-pixel patches on a 128 × 128 picture) whose 64 patches are pooled into 16
image tokens, in front of a {argv['layers']}-layer llama (hidden {argv['hidden']}) with the demo model's
byte-level BPE tokenizer and a ChatML template: 828,384 parameters in float32. It was trained from
scratch by `demo/vision.py` on synthetic pictures, each conversation rendered exactly as mlx-vlm (and
so `mlx_vlm.server`) renders it: {stages} ({seconds} s in all on this machine's CPU; the second stage
starts from the first's weights, `--start`). Colour comes first and fast; the shape takes the many
short single-picture conversations of the second stage.

It is not an assistant: it names the one shape in a plain picture and nothing else.

## What it was taught

| user says (with a picture, or after one) | model answers |
|---|---|
| `What is in the picture?` (and 4 other phrasings) | `a red circle` |
| `What colour is the shape?` / `What shape is it?` | `red` / `circle` |
| later, without the picture: `What colour was it?` / `What shape was it?` | `red` / `circle` |
| later, without the picture: `What was in the picture?` | `a red circle` |
| `What is in the picture?` with no picture at all | `I don't see a picture.` |

Colours: red, green, blue, yellow. Shapes: circle, square, triangle. Backgrounds: white, black, grey,
beige or pale blue. Training pictures are 48 to 400 pixels a side, the shape a quarter to seven tenths
of the short side, anywhere in the frame; the processor squeezes every picture to 128 × 128.

## Figures (held-out pictures, temperature 0)

Pictures drawn with a seed training never used, at 32 to 1,000 pixels a side (past the sizes it was
trained on), each sent through localchat's history builder and then through each backend
(`demo/vision_card.py`). Two turns: the picture and "What is in the picture?", then, with the model's own
first answer in the history, "What colour was it?" or "What shape was it?" (which only the first
turn's picture can answer).

| backend | pictures | one turn (exact) | two turns (second answer exact) |
|---|---|---|---|
{rows}

First misses in-process: {misses}.

Measured on {machine.os} {machine.machine} ({machine.chip}, MLX {machine.mlx_version} on the {machine.mlx_device},
mlx-vlm {_version('mlx-vlm')}), not on Apple Silicon; the evaluation took {figures['seconds']} s.
"""


if __name__ == "__main__":
    main()
