"""A shape circuit planted in ``demo-vision``'s vision tower, as the demo model starts from a copy circuit.

From random weights, gradient descent found a picture's colour at once and its shape not at all
within this CPU's budget (the card lists the runs), even with the tower trained on the shape
directly. So the tower is set by hand, then frozen, and only the connector and the language model
are trained to read it. It is mlx-vlm's ``idefics3`` tower, weights only:

1. The patch embedding takes the chroma of each 16-pixel patch (the backgrounds are nearly grey,
   the shapes saturated) through ``ORIENTATIONS`` oriented edge filters, plus a small constant and
   the patch's mean chroma.
2. Layer 1's MLP rectifies each filter (GELU(gx) + GELU(-gx) ≈ g|x|): an edge's strength at each
   orientation, whatever the colour pair. The layer norm before it divides a patch by its own
   strength, so the profile does not depend on the contrast.
3. Layer 2's first attention head asks every patch the same question (a constant query) and weighs
   each patch by its edge strength (the key), so every token receives the orientation profile of
   the shape's outline, whatever its size or place: a square's edges lie on two orientations, a
   triangle's on three, a circle's on all. Its second head, keyed on each patch's saturation (the
   layer-1 MLP rectifies the mean chroma too), pools the colour of the shape's inside.
4. Layer 3's MLP is a linear readout of those pooled features (``fit_readout``, fitted by the
   trainer on pictures of its own), written loud: three shape logits and four colour logits on
   every token, which the language model learns to read.

On 150 held-out pictures the readout alone names the shape of about three in four and the colour of
nearly all (``tests/training/test_vision_circuit.py``); a picture squeezed far from square reads worse.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

ORIENTATIONS = 12
SIGMA, ELONGATION = 3.0, 2.0  # the filters' width across an edge and along it (× SIGMA), in pixels
CONSTANT = 0.1  # a channel every patch has: an edgeless patch's layer norm stays small
CHROMA_SCALE = 0.1  # the mean chroma's share, small beside the edges in each patch's norm
GAIN = 4.0  # how sharp the rectifier's corner is
FOCUS = 8.0  # how strongly the pooling prefers strong edges
SATURATION_FOCUS = 20.0  # how strongly the colour pooling prefers the most coloured patches
LOUDNESS = 10.0  # the pooled profile's size beside each patch's own channels
READOUT_LOUDNESS = 100.0  # the readout's size beside the pooled profile

U = np.array([2, -1, -1]) / math.sqrt(6)  # chroma: red against green and blue
V = np.array([0, 1, -1]) / math.sqrt(2)  # chroma: green against blue
RAW, EDGE = 1, 1 + 2 * ORIENTATIONS  # channel 0 is the constant; then the filters (u, v), the edges
CHROMA = EDGE + ORIENTATIONS  # the patch's mean chroma (u, v)
POOLED = CHROMA + 2  # what the pooling writes: the edges' profile and chroma, then the saturated patches' chroma
FEATURES = ORIENTATIONS + 4
LOGITS = 3 + 4  # three shapes, four colours
READOUT = POOLED + FEATURES  # where the logits go
SATURATION = READOUT + LOGITS  # how coloured a patch is: where the shape's inside is


def oriented_filters(side: int) -> np.ndarray:
    """Derivative-of-Gaussian filters at ``ORIENTATIONS`` angles over half a turn, each summing to 1 in |·|."""
    ys, xs = np.mgrid[0:side, 0:side] - (side - 1) / 2
    filters = []
    for k in range(ORIENTATIONS):
        angle = math.pi * k / ORIENTATIONS
        across = math.cos(angle) * xs + math.sin(angle) * ys
        along = -math.sin(angle) * xs + math.cos(angle) * ys
        f = across * np.exp(-across ** 2 / (2 * SIGMA ** 2) - along ** 2 / (2 * (SIGMA * ELONGATION) ** 2))
        filters.append(f / np.abs(f).sum())
    return np.stack(filters)


def plant_shape_circuit(vision_model) -> None:
    """Set ``vision_model`` (an idefics3 tower) to the circuit above and freeze it."""
    embeddings = vision_model.embeddings
    width, side = embeddings.patch_embedding.weight.shape[:2]
    _plant_patches(embeddings, width, side)
    embeddings.position_embedding.weight = mx.zeros_like(embeddings.position_embedding.weight)
    for layer in vision_model.encoder.layers:
        for writer in (layer.self_attn.out_proj, layer.mlp.fc2):
            writer.weight, writer.bias = mx.zeros_like(writer.weight), mx.zeros_like(writer.bias)
    layers = vision_model.encoder.layers
    _plant_rectifier(layers[0].mlp, width)
    _plant_pooling(layers[1].self_attn, width)
    for norm in _layer_norms(vision_model):
        norm.weight, norm.bias = mx.ones_like(norm.weight), mx.zeros_like(norm.bias)
    vision_model.freeze()


def _layer_norms(vision_model) -> list:
    layers = vision_model.encoder.layers
    return [vision_model.post_layernorm, *(n for layer in layers for n in (layer.layer_norm1, layer.layer_norm2))]


def _plant_patches(embeddings, width: int, side: int) -> None:
    weight = np.zeros((width, side, side, 3), np.float32)
    bias = np.zeros(width, np.float32)
    bias[0] = CONSTANT
    for k, f in enumerate(oriented_filters(side)):
        weight[RAW + 2 * k], weight[RAW + 2 * k + 1] = f[:, :, None] * U, f[:, :, None] * V
    for i, chroma in enumerate((U, V)):
        weight[CHROMA + i] = np.full((side, side, 1), CHROMA_SCALE / side ** 2) * chroma
    embeddings.patch_embedding.weight, embeddings.patch_embedding.bias = mx.array(weight), mx.array(bias)


def _plant_rectifier(mlp, width: int) -> None:
    """Units 4k..4k+3 read filter k's u and v, each both ways; edge channel k sums them: g|u| + g|v|, over g.
    The next four do the same for the patch's mean chroma: its saturation."""
    hidden = mlp.fc1.weight.shape[0]
    fc1, fc2 = np.zeros((hidden, width), np.float32), np.zeros((width, hidden), np.float32)
    for k in range(ORIENTATIONS):
        for part in range(2):
            for sign, unit in ((1, 4 * k + 2 * part), (-1, 4 * k + 2 * part + 1)):
                fc1[unit, RAW + 2 * k + part] = sign * GAIN
                fc2[EDGE + k, unit] = 1 / GAIN
    for part in range(2):
        for sign, unit in ((1, 4 * ORIENTATIONS + 2 * part), (-1, 4 * ORIENTATIONS + 2 * part + 1)):
            fc1[unit, CHROMA + part] = sign * GAIN
            fc2[SATURATION, unit] = 1 / GAIN
    mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight = mx.array(fc1), mx.zeros((hidden,)), mx.array(fc2)


def _plant_pooling(attention, width: int) -> None:
    """Head 0: a constant query, a key that is the patch's edge strength, a value that is its edges and
    chroma. Head 1: the same query, a key that is the patch's saturation, a value that is its chroma."""
    head_width = width // attention.num_heads
    second = head_width  # head 1's first dimension
    query_bias = np.zeros(width, np.float32)
    query_bias[0] = query_bias[second] = 1.0
    key, value, out = (np.zeros((width, width), np.float32) for _ in range(3))
    key[0, EDGE:EDGE + ORIENTATIONS] = FOCUS * math.sqrt(head_width) / ORIENTATIONS
    for i in range(ORIENTATIONS + 2):
        value[i, EDGE + i] = 1.0
        out[POOLED + i, i] = LOUDNESS
    key[second, SATURATION] = SATURATION_FOCUS * math.sqrt(head_width)
    for i in range(2):
        value[second + i, CHROMA + i] = 1.0
        out[POOLED + ORIENTATIONS + 2 + i, second + i] = LOUDNESS
    attention.q_proj.weight, attention.q_proj.bias = mx.zeros((width, width)), mx.array(query_bias)
    attention.k_proj.weight, attention.k_proj.bias = mx.array(key), mx.zeros((width,))
    attention.v_proj.weight, attention.v_proj.bias = mx.array(value), mx.zeros((width,))
    attention.out_proj.weight = mx.array(out)


def pooled_features(vision_model, pixels: np.ndarray, tokens: int = 8) -> np.ndarray:
    """The pooled profile in the tower's output for ``pixels`` (N, 3, H, W), normed as each token
    norms it: (N × ``tokens``, profile), from ``tokens`` patches spread over each picture."""
    out = []
    for start in range(0, len(pixels), 100):
        hidden, *_ = vision_model(mx.array(pixels[start:start + 100]).transpose(0, 2, 3, 1))
        every = hidden.shape[1] // tokens
        out.append(np.array(hidden[:, ::every, POOLED:READOUT]).reshape(-1, FEATURES))
    return np.concatenate(out)


def fit_readout(features: np.ndarray, labels: np.ndarray, classes: int, steps: int = 3000) -> tuple:
    """A multinomial logistic regression of ``labels`` on ``features``, standardized, then folded
    back so that it reads the raw features: (weights (classes, width), bias (classes,))."""
    mean, spread = features.mean(0), features.std(0) + 1e-6
    x = (features - mean) / spread
    weights, bias, truth = np.zeros((x.shape[1], classes)), np.zeros(classes), np.eye(classes)[labels]
    for _ in range(steps):
        logits = x @ weights + bias
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        weights -= 0.5 * x.T @ (p - truth) / len(x)
        bias -= 0.5 * (p - truth).mean(0)
    folded = weights / spread[:, None]
    return folded.T, bias - mean @ folded


def plant_readout(vision_model, weights: np.ndarray, bias: np.ndarray) -> None:
    """The last layer's MLP writes each class's logit (its input is the tower's output so far, normed
    as the final norm norms it), loud, after the pooled profile: the language model reads a few
    strong numbers instead of a faint profile. Units 2c, 2c+1 pass logit c through: GELU(gz) - GELU(-gz) = gz."""
    mlp = vision_model.encoder.layers[-1].mlp
    hidden, width = mlp.fc1.weight.shape
    fc1, fc1_bias = np.zeros((hidden, width), np.float32), np.zeros(hidden, np.float32)
    fc2 = np.zeros((width, hidden), np.float32)
    for c, (row, b) in enumerate(zip(weights, bias)):
        for sign, unit in ((1, 2 * c), (-1, 2 * c + 1)):
            fc1[unit, POOLED:POOLED + len(row)], fc1_bias[unit] = sign * GAIN * row, sign * GAIN * b
            fc2[READOUT + c, unit] = sign * READOUT_LOUDNESS / GAIN
    mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight = mx.array(fc1), mx.array(fc1_bias), mx.array(fc2)
