"""Synthetic pictures and the conversations about them that teach and test ``demo-vision``.

A picture is one plain shape (circle, square or triangle) in one of four colours on a plain
background, at any size from 48 to 400 pixels a side and any position; the answer names both:
``a red circle``. Follow-up questions ask about the picture of an earlier turn ("What colour was
it?"), so a model can only answer them from its history.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from PIL import Image, ImageDraw

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 40), "blue": (40, 60, 220), "yellow": (235, 215, 30)}
SHAPES = ("circle", "square", "triangle")
BACKGROUNDS = ((255, 255, 255), (0, 0, 0), (128, 128, 128), (240, 235, 220), (200, 220, 240))
SYSTEMS = (None, "You are a helpful assistant.", "You are a concise assistant.", "Answer briefly.")

WHAT = ("What is in the picture?", "What do you see?", "Describe the picture.", "What is this?",
        "What is in this image?")
COLOUR_NOW = ("What colour is the shape?", "What color is it?", "Which colour is it?")
SHAPE_NOW = ("What shape is it?", "Which shape is in the picture?")
WHAT_WAS = ("What was in the picture?", "What was in the image?", "What did the picture show?")
COLOUR_WAS = ("What colour was it?", "What color was the shape?", "And its colour?")
SHAPE_WAS = ("What shape was it?", "And the shape?", "Which shape was it?")
NO_PICTURE = "I don't see a picture."


@dataclass(frozen=True)
class Picture:
    image: Image.Image
    colour: str
    shape: str

    @property
    def answer(self) -> str:
        return f"a {self.colour} {self.shape}"


@dataclass(frozen=True)
class Framing:
    """How pictures are drawn: the range of their sides, how far from square they may be (None:
    any), and the shape's share of the short side. The processor squeezes every picture to a square,
    so a picture far from square squeezes its shape into a sliver no 16-pixel patch can read."""

    sides: tuple[int, int] = (48, 400)
    max_aspect: float | None = None
    scale: tuple[float, float] = (0.25, 0.7)

    def size(self, rng: random.Random) -> tuple[int, int]:
        width = rng.randint(*self.sides)
        if self.max_aspect is None:
            return width, rng.randint(*self.sides)
        low = max(self.sides[0], math.ceil(width / self.max_aspect))
        return width, rng.randint(low, min(self.sides[1], math.floor(width * self.max_aspect)))


ANY = Framing()  # the first stage's pictures
FRAMED = Framing(sides=(48, 640), max_aspect=2.5, scale=(0.35, 0.85))  # the shape large enough to read


def draw(colour: str, shape: str, width: int, height: int, rng: random.Random,
         background: tuple[int, int, int] | None = None, scale: tuple[float, float] = ANY.scale) -> Picture:
    """``shape`` in ``colour``, ``scale`` of the short side, anywhere in the frame."""
    img = Image.new("RGB", (width, height), background or rng.choice(BACKGROUNDS))
    side = rng.uniform(*scale) * min(width, height)
    x, y = rng.uniform(0, width - side), rng.uniform(0, height - side)
    pen = ImageDraw.Draw(img)
    fill = COLOURS[colour]
    if shape == "circle":
        pen.ellipse([x, y, x + side, y + side], fill=fill)
    elif shape == "square":
        pen.rectangle([x, y, x + side, y + side], fill=fill)
    else:
        pen.polygon([(x + side / 2, y), (x, y + side), (x + side, y + side)], fill=fill)
    return Picture(img, colour, shape)


def random_picture(rng: random.Random, framing: Framing = ANY) -> Picture:
    colour, shape = rng.choice(list(COLOURS)), rng.choice(SHAPES)
    return draw(colour, shape, *framing.size(rng), rng, scale=framing.scale)


def _question(rng: random.Random, picture: Picture, asks: tuple[tuple[str, ...], ...],
              cuts: tuple[float, float]) -> tuple[str, str]:
    """A question of ``asks`` (the whole picture, its colour, its shape) and its answer: the whole
    while a draw is under ``cuts[0]``, the colour under ``cuts[1]``, else the shape."""
    kind = rng.random()
    which = 0 if kind < cuts[0] else 1 if kind < cuts[1] else 2
    return rng.choice(asks[which]), (picture.answer, picture.colour, picture.shape)[which]


def _question_about_new(rng: random.Random, picture: Picture) -> tuple[str, str]:
    return _question(rng, picture, (WHAT, COLOUR_NOW, SHAPE_NOW), (0.6, 0.8))


def _question_about_earlier(rng: random.Random, picture: Picture) -> tuple[str, str]:
    return _question(rng, picture, (WHAT_WAS, COLOUR_WAS, SHAPE_WAS), (0.4, 0.7))


Turns = list[tuple[Picture | None, str, str]]  # (the picture shown, or None; the question; the answer)


def one_question(rng: random.Random, framing: Framing = ANY) -> tuple[str | None, Turns]:
    """A picture and one question about it, no system message: short, so a step sees many pictures."""
    picture = random_picture(rng, framing)
    return None, [(picture, *_question_about_new(rng, picture))]


def conversation(rng: random.Random, framing: Framing = ANY) -> tuple[str | None, Turns]:
    """A system message (or none) and 1-3 turns of (picture or None, question, answer): a picture
    first, then questions about it or a new picture; now and then a question with no picture at all."""
    if rng.random() < 0.04:
        return rng.choice(SYSTEMS), [(None, rng.choice(WHAT), NO_PICTURE)]
    latest = random_picture(rng, framing)
    turns = [(latest, *_question_about_new(rng, latest))]
    for _ in range(rng.choice((0, 0, 1, 1, 2))):
        if rng.random() < 0.3:
            latest = random_picture(rng, framing)
            turns.append((latest, *_question_about_new(rng, latest)))
        else:
            turns.append((None, *_question_about_earlier(rng, latest)))
    return rng.choice(SYSTEMS), turns
