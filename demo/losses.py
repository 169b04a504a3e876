"""Training batches (one worker's share, padded to few shapes) and the two losses over them."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np


@dataclass(frozen=True)
class Batch:
    """One worker's share of a global batch: ``targets`` and ``mask`` (1 where the model is
    trained) align with ``inputs``; ``trained`` lists those positions as flat indices, padded
    to a multiple of 16 with weight 0 in ``trained_weights``."""
    inputs: mx.array
    targets: mx.array
    mask: mx.array
    trained: mx.array
    trained_weights: mx.array
    tokens: int


def make_batches(rows, batch_size: int, pad_id: int, rng: random.Random, rank: int = 0, size: int = 1):
    """Batches of similar-length rows (little padding), padded to a multiple of 16 tokens so
    that mx.compile sees few shapes; batch order is shuffled. With several workers, each takes
    its own share of every global batch (``batch_size`` rows in all)."""
    order = sorted(range(len(rows)), key=lambda j: len(rows[j][0]))
    chunks = [order[i:i + batch_size] for i in range(0, len(order) - batch_size + 1, batch_size)]
    rng.shuffle(chunks)
    for chunk in chunks:
        chunk = chunk[rank::size]
        width = _padded_size(max(len(rows[j][0]) for j in chunk))
        x = np.full((len(chunk), width + 1), pad_id, dtype=np.int32)
        m = np.zeros((len(chunk), width + 1), dtype=np.float32)
        for r, j in enumerate(chunk):
            ids, mask = rows[j]
            x[r, :len(ids)] = ids
            m[r, :len(mask)] = mask
        yield _batch(x, m, pad_id)


def _padded_size(n: int) -> int:
    """``n`` rounded up to a multiple of 16, so that mx.compile sees few shapes."""
    return 16 * math.ceil(n / 16)


def _batch(x: np.ndarray, m: np.ndarray, pad_id: int) -> Batch:
    inputs, mask = x[:, :-1], m[:, 1:]
    trained = np.flatnonzero(mask)
    size = _padded_size(len(trained))
    positions, weights = np.zeros(size, dtype=np.int32), np.zeros(size, dtype=np.float32)
    positions[:len(trained)], weights[:len(trained)] = trained, mask.reshape(-1)[trained]
    return Batch(mx.array(inputs), mx.array(x[:, 1:]), mx.array(mask), mx.array(positions), mx.array(weights),
                 tokens=int((inputs != pad_id).sum()))


def plain_loss(model: nn.Module, inputs: mx.array, targets: mx.array, mask: mx.array) -> mx.array:
    """Mean cross-entropy over the trained (assistant) positions of the full output."""
    ce = nn.losses.cross_entropy(model(inputs), targets) * mask
    return ce.sum() / mask.sum()


def loss_on_trained_positions(model: nn.Module, inputs: mx.array, targets: mx.array,
                              trained: mx.array, weights: mx.array) -> mx.array:
    """``plain_loss``, computed only where it counts (``--fast-loss``).

    Most positions are prompts and train nothing, yet a plain ``model(x)`` pays for their last
    MLP and their output logits (vocabulary-wide), about a third of the step. Here the last
    layer's attention runs over every position (later positions attend to them), its MLP and the
    output layer only over trained ones. The norms still see every position (the trained rows
    scattered back), so their weight gradients are summed over the same layout as the plain
    loss's. Even so the gradients equal the plain loss's only up to float rounding
    (tests/test_demo_model.py), not to the bit, and training amplifies rounding: the same seed
    then trains a different model, as good or bad as another seed's."""
    inner, last = model.model, model.model.layers[-1]
    h = inner.embed_tokens(inputs)
    for layer in inner.layers[:-1]:
        h = layer(h, "causal")
    rows, width, dim = h.shape
    h = (h + last.self_attn(last.input_layernorm(h), "causal")).reshape(rows * width, dim)
    out = h[trained] + last.mlp(last.post_attention_layernorm(h)[trained])
    h = mx.zeros_like(h).at[trained].add(out * weights[:, None])
    logits = inner.embed_tokens.as_linear(inner.norm(h)[trained])
    ce = nn.losses.cross_entropy(logits, targets.reshape(-1)[trained]) * weights
    return ce.sum() / weights.sum()
