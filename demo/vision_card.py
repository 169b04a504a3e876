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

from demo.pictures import COLOUR_WAS, FRAMED, SHAPE_WAS, WHAT, Framing, random_picture
from localchat.backends import GenerationParams, TextChunk
from localchat.conversation.history import Conversation, Turn
from localchat.vision.image import Picture, picture_from_bytes

SYSTEM = "You are a helpful assistant."
HELD_OUT_SEED = 20261205


HELD_OUT = Framing(sides=(32, 1000), max_aspect=FRAMED.max_aspect, scale=FRAMED.scale)  # past the trainer's sides
THIN = Framing(sides=(32, 1000))  # any aspect: a picture far from square squeezes its shape into a sliver


def held_out(n: int, framing: Framing = HELD_OUT, seed: int = HELD_OUT_SEED):
    """``n`` pictures drawn with a seed the trainer never uses."""
    rng = random.Random(seed)
    for _ in range(n):
        picture = random_picture(rng, framing)
        buffer = io.BytesIO()
        picture.image.save(buffer, format="PNG")
        yield picture, picture_from_bytes(buffer.getvalue(), "held-out.png")


def reply(backend: Any, messages: list[dict]) -> str:
    params = GenerationParams(temperature=0.0, max_tokens=16)
    return "".join(e.text for e in backend.stream(messages, params) if isinstance(e, TextChunk)).strip()


def score(backend: Any, n: int, rng: random.Random, framing: Framing = HELD_OUT) -> dict[str, Any]:
    """One turn (what is in it), and two turns (then its colour or its shape), over ``n`` pictures."""
    one = two = colour = shape = 0
    misses: list[str] = []
    for truth, picture in held_out(n, framing):
        conversation = Conversation(SYSTEM)
        question = rng.choice(WHAT)
        answer = ask(backend, conversation, question, (picture,))
        one += answer == truth.answer
        colour += truth.colour in answer.split()
        shape += truth.shape in answer.split()
        if answer != truth.answer and len(misses) < 5:
            misses.append(f"{truth.answer} → {answer!r}")
        asks_colour = rng.random() < 0.5
        follow = rng.choice(COLOUR_WAS if asks_colour else SHAPE_WAS)
        two += ask(backend, conversation, follow) == (truth.colour if asks_colour else truth.shape)
    return {"one_turn": one / n, "two_turns": two / n, "colour": colour / n, "shape": shape / n, "pictures": n,
            "misses": misses}


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
    local = in_process(args.model)
    figures = {"in_process": score(local, args.pictures, random.Random(1)),
               "in_process_any_aspect": score(local, args.pictures, random.Random(1), THIN)}
    figures["mlx_vlm_server"] = over_http(args.model, lambda b: score(b, args.http_pictures, random.Random(1)),
                                          Path("/tmp") / f"demo-vision-card-{time.time_ns()}.log")
    figures["seconds"] = round(time.time() - started)
    (args.model / "eval.json").write_text(json.dumps(figures, indent=2) + "\n")
    (args.model / "README.md").write_text(card(figures, json.loads((args.model / "training.json").read_text())))
    print(json.dumps(figures, indent=2))


TRIED = """## Why the tower is planted

Seven runs on this machine's CPU (about two hours) did not teach a trained tower the shape, each
evaluated on held-out pictures:

- two stages from random weights: the shape at chance after 1,800 steps, though the loss fell to 0.07
  (the colour and the recall of history carry it);
- a third stage of 300 steps on `framed` pictures only; 250 steps of shape questions alone; one token
  a picture instead of 16 (300 steps from scratch);
- an edge circuit planted at the start, then trained with the rest: the shape at 38 % after 1,300 steps;
- the tower alone trained on the shape (a classifier on its pooled output, no language model): 51 %
  after 300 steps of 32 pictures.

A linear probe on those towers' features read the shape at 42 %. So the tower is now set by hand and
frozen (`demo/vision_circuit.py`). Its readout is what limits the toy: it names the shape of about
three held-out pictures in four before the language model is trained at all, and the language model
reads most of that. What is next: a finer profile than 12 orientations of one scale, or the language
model's reading planted too.

"""


def _status(figures: dict[str, Any]) -> str:
    """The card's first line: what the toy sees, said plainly."""
    if figures["shape"] >= 0.9:
        return f"**Status: names colour and shape** ({figures['one_turn']:.0%} exact on held-out pictures)."
    if figures["shape"] >= 0.5:
        return (f"**Status: names a picture's colour ({figures['colour']:.0%} on held-out pictures) and, less "
                f"surely, its shape ({figures['shape']:.0%}; chance is 33%).** Its vision tower is planted: see "
                "why, below.")
    return (f"**Status: names a picture's colour ({figures['colour']:.0%} on held-out pictures), not yet its shape "
            f"({figures['shape']:.0%}, chance is 33 %).** Image chat works end to end in both backends; the "
            "toy's eyes are half trained: see what did not teach it the shape, below.")


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def card(figures: dict[str, Any], training: dict[str, Any]) -> str:
    """The model card: what the toy is, how it was made, and its held-out figures in both backends."""
    from localchat.environment import collect

    machine = collect()
    rows = "\n".join(f"| {where} | {f['pictures']} | {f['one_turn']:.1%} | {f['colour']:.1%} | {f['shape']:.1%} | "
                     f"{f['two_turns']:.1%} |"
                     for where, f in (("in-process (mlx-vlm)", figures["in_process"]),
                                      ("`mlx_vlm.server` (HTTP)", figures["mlx_vlm_server"]),
                                      ("in-process, any aspect (up to 31:1)", figures["in_process_any_aspect"])))
    misses = "; ".join(figures["in_process"]["misses"]) or "none"
    first = training["stages"][0]
    stages = "; then ".join(
        f"{s['steps']} steps of {s['batch']} conversations at learning rate {s['lr']}, pictures `{s['framing']}`"
        + (f", {s['focus']:.0%} of them one question about one picture" if s["focus"] else "")
        + (", the tower planted and frozen" if s.get("plant") else "")
        for s in training["stages"])
    seconds = sum(s["train_seconds"] for s in training["stages"])
    planted = any(s.get("plant") for s in training["stages"])
    tried = TRIED if planted or figures["in_process"]["shape"] < 0.9 else ""
    planted = ("Its vision tower is not trained but planted (`demo/vision_circuit.py`): oriented edge filters on "
               "each patch's chroma, rectified; an attention head that pools the outline's orientation profile from "
               "the strongest edges, and one that pools the colour of the most coloured patches; a linear readout of "
               "shape and colour fitted on 1,500 pictures; then frozen. Only the connector and the language model "
               "learn to read it. ") if planted else ""
    return f"""# demo-vision: a toy that really looks

{_status(figures["in_process"])}

A **toy** vision-language model, bundled so that image chat can be tried and tested offline. It is
mlx-vlm's own `idefics3` architecture (SmolVLM's): a {first['vision_layers']}-layer ViT (hidden
{first['vision_hidden']}, 16-pixel patches on a 128 × 128 picture) whose 64 patches are pooled
{first['scale']} × {first['scale']} into image tokens, in front of a {first['layers']}-layer llama (hidden
{first['hidden']}) with the demo model's byte-level BPE tokenizer and a ChatML template, in float32.
{planted}It was trained by `demo/vision.py` on synthetic pictures, each conversation
rendered exactly as mlx-vlm (and so `mlx_vlm.server`) renders it: {stages} ({seconds} s in all on
this machine's CPU).

It is not an assistant: it was taught to name the one shape in a plain picture, and nothing else.

## What it was taught

| user says (with a picture, or after one) | model answers |
|---|---|
| `What is in the picture?` (and 4 other phrasings) | `a red circle` |
| `What colour is the shape?` / `What shape is it?` | `red` / `circle` |
| later, without the picture: `What colour was it?` / `What shape was it?` | `red` / `circle` |
| later, without the picture: `What was in the picture?` | `a red circle` |
| `What is in the picture?` with no picture at all | `I don't see a picture.` |

Colours: red, green, blue, yellow. Shapes: circle, square, triangle. Backgrounds: white, black, grey,
beige or pale blue. Pictures `any` are 48 to 400 pixels a side, the shape 0.25 to 0.7 of the short side;
pictures `framed` are 48 to 640 a side, at most 2.5 : 1, the shape 0.35 to 0.85 of the short side; the
shape anywhere in the frame. The processor squeezes every picture to 128 × 128, so a picture far from
square squeezes its shape into a sliver (last row below).

## Figures (held-out pictures, temperature 0)

Pictures drawn with a seed training never used, at 32 to 1,000 pixels a side (past the sizes it was
trained on) and at most 2.5 : 1. Each is sent through localchat's history builder and then through each
backend (`demo/vision_card.py`). Two turns: the picture and "What is in the picture?", then, with the
model's own first answer in the history, "What colour was it?" or "What shape was it?", which only the
first turn's picture can answer.

| backend | pictures | one turn (exact) | colour named | shape named | two turns (second answer exact) |
|---|---|---|---|---|---|
{rows}

First misses in-process: {misses}.

{tried}Measured on {machine.os} {machine.machine} ({machine.chip}, MLX {machine.mlx_version} on the
{machine.mlx_device}, mlx-vlm {_version('mlx-vlm')}), not on Apple Silicon; the evaluation took {figures['seconds']} s.
"""


if __name__ == "__main__":
    main()
