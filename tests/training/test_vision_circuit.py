"""demo-vision's planted shape circuit: before any training, the tower's readout names the shape
and the colour of pictures it was not fitted on, and nothing in the tower is left to train."""

import argparse
import random

import numpy as np
import pytest

pytestmark = pytest.mark.training


def test_the_planted_tower_reads_shape_and_colour_of_unseen_pictures(tmp_path):
    pytest.importorskip("mlx_vlm")
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from demo.pictures import COLOURS, FRAMED, SHAPES, random_picture
    from demo.vision import build_processor, model_config, new_model, pixels_of, plant_vision_circuit
    from demo.vision_circuit import LOGITS, READOUT

    processor = build_processor(tmp_path)
    sizes = argparse.Namespace(scale=2, hidden=96, layers=2, vision_hidden=96, patch=16, vision_layers=3)
    model = new_model(model_config(sizes, processor))
    plant_vision_circuit(model.vision_model, processor, random.Random(0), pictures=400)
    assert not tree_flatten(model.vision_model.trainable_parameters())

    rng = random.Random(7)
    unseen = [random_picture(rng, FRAMED) for _ in range(150)]
    hidden, *_ = model.vision_model(mx.array(pixels_of(processor, unseen)).transpose(0, 2, 3, 1))
    logits = np.array(hidden[:, :, READOUT:READOUT + LOGITS].mean(axis=1))  # three shapes, four colours
    shapes = np.mean(logits[:, :3].argmax(1) == [SHAPES.index(p.shape) for p in unseen])
    colours = np.mean(logits[:, 3:].argmax(1) == [list(COLOURS).index(p.colour) for p in unseen])
    assert shapes > 0.6, f"shape read {shapes:.0%} (chance is 33 %)"
    assert colours > 0.7, f"colour read {colours:.0%} (chance is 25 %)"


def test_the_bundled_toy_names_shape_and_colour_of_held_out_pictures():
    """What its card says, on a smaller draw of the card's held-out pictures: the colour nearly
    always, the shape far above chance (a third)."""
    pytest.importorskip("mlx_vlm")
    from conftest import ROOT
    from demo.vision_card import in_process, score

    figures = score(in_process(ROOT / "localchat" / "demo_vision_model"), 60, random.Random(1))
    assert figures["colour"] >= 0.9 and figures["shape"] >= 0.5, figures
