"""The copy circuit planted in the demo model before training (see ``plant_induction_circuit``)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten


def rope_frequencies(config: dict) -> np.ndarray:
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    return config["rope_theta"] ** (-np.arange(0, head_dim, 2) / head_dim)


def plant_induction_circuit(model: nn.Module, config: dict, amplitude: float = 12.0, gain: float = 6.0) -> None:
    """Start the model with a working copy circuit, which training then refines.

    Copying a word the model has never seen needs an induction circuit: a head that writes each
    token's predecessor into the residual stream, and a head in the next layer that looks for the
    position whose predecessor is the current token and copies what stands there. Gradient descent
    finds it only after far more tokens than a 2-core CPU trains in 45 minutes (measured here:
    plain copying of random letters still at chance after 250 steps, with or without help), so it
    is set up by hand. The residual stream is split in halves: A (token identity: the embedding
    lives there) and B (what came before), both cut into head-sized slices p.

    - Layer 0, heads p: previous-token heads. Through RoPE, query/key *biases* on the
      high-frequency dimension pairs give the content-free score a² Σ_j cos((Δ - d) θ_j), which
      peaks at distance Δ = d = 1; each copies A_p into B_p.
    - Layer 0, heads P+p: the same at d = 2; they write the token two back into the dimensions
      of B_p that matching never reads (the "store" dimensions, see ``_copy_dimensions``).
    - Layer 1, heads p: induction heads. On the low-frequency pairs (θ_j · 1000 < 1, so RoPE
      barely rotates them over a conversation) the query reads the current token from A_p and the
      key each position's predecessor from B_p; each copies A_p from the matched position.
    - Layer 1, heads P+p: the same one step back (the current token's predecessor against each
      position's token two back). Both copy into A_p, so a position that matches the last *two*
      tokens outvotes one that matches only the last: copying `ppbkb` or `rcrelu` is no longer
      ambiguous after a repeated letter (untrained, teacher-forced whole-code copies of held-out
      codes: English 41 → 78 %, Chinese 69 → 91 %).
    Both MLPs' outputs and B's embedding columns start at zero so they add no noise to the
    circuit; training grows them. So does the MLP output of any further layer, whose attention
    starts random (it learns which copied day a question asks for). Measured, full runs: with a
    wholly random third layer English recall never recovered (7/200, Chinese 197/200); with its
    attention output zeroed too, corrected facts stayed at 14 % (English) and 77.5 % (Chinese).
    """
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = hidden // heads
    planted = hidden // 2 // head_dim  # heads needed to carry half the stream
    if hidden % (2 * head_dim) or config["num_hidden_layers"] < 2 or 2 * planted > heads:
        raise SystemExit("--plant-induction needs ≥ 2 layers, hidden/2 a multiple of the head size "
                         "and at least hidden/head_size heads")
    theta = rope_frequencies(config)
    match, store = _copy_dimensions(theta, head_dim)
    b_start = hidden // 2
    embed = np.array(model.model.embed_tokens.weight)
    embed[:, b_start:] = 0.0
    scale = float(embed[:, :b_start].std()) * np.sqrt(0.5)  # B at the embedding's scale
    layers = model.model.layers
    params = {name: np.array(w) for name, w in tree_flatten(
        {f"l{i}": layer.parameters() for i, layer in enumerate(layers[:2])})}

    def w(layer: int, name: str) -> np.ndarray:
        return params[f"l{layer}.self_attn.{name}"]

    for layer in (0, 1):
        params[f"l{layer}.mlp.down_proj.weight"][:] = 0.0
        w(layer, "o_proj.weight")[:] = 0.0
        w(layer, "o_proj.bias")[:] = 0.0
    for p in range(planted):
        a = np.arange(p * head_dim, (p + 1) * head_dim)  # A_p
        b = b_start + a  # B_p
        for head in (p, planted + p):
            q = head * head_dim + np.arange(head_dim)  # the head's own rows and columns
            for layer in (0, 1):
                for name in ("q_proj", "k_proj", "v_proj"):
                    w(layer, f"{name}.weight")[q] = 0.0
                    w(layer, f"{name}.bias")[q] = 0.0
                w(layer, "v_proj.weight")[q, a] = 1.0
            _attend_back(w(0, "q_proj.bias"), w(0, "k_proj.bias"), head * head_dim, theta,
                         distance=1 if head == p else 2, amplitude=amplitude)
            w(1, "o_proj.weight")[a, q] = 1.0
        previous, two_back = p * head_dim, (planted + p) * head_dim
        keep = np.setdiff1d(np.arange(head_dim), store)
        w(0, "o_proj.weight")[b[keep], previous + keep] = scale
        w(0, "o_proj.weight")[b[store], two_back + match] = scale
        w(1, "q_proj.weight")[previous + match, a[match]] = gain
        w(1, "k_proj.weight")[previous + match, b[match]] = 1.0
        w(1, "q_proj.weight")[two_back + match, b[match]] = gain
        w(1, "k_proj.weight")[two_back + match, b[store]] = 1.0
    model.model.embed_tokens.weight = mx.array(embed)
    for i, layer in enumerate(layers[:2]):
        layer.update(tree_unflatten([(name.split(".", 1)[1], mx.array(value))
                                     for name, value in params.items() if name.startswith(f"l{i}.")]))
    for layer in layers[2:]:
        layer.mlp.down_proj.weight = mx.zeros_like(layer.mlp.down_proj.weight)


def _copy_dimensions(theta: np.ndarray, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Within a head: the dimensions that match tokens (both halves of the RoPE pairs that barely
    rotate over a conversation, at most half the head) and as many others, which RoPE would
    scramble for matching, to store the token two back."""
    half = head_dim // 2
    low = [j for j in range(half) if theta[j] * 1000 < 1][-(head_dim // 4):]
    match = np.array(low + [half + j for j in low])
    store = np.setdiff1d(np.arange(head_dim), match)[:len(match)]
    return match, store


def _attend_back(q_bias: np.ndarray, k_bias: np.ndarray, start: int, theta: np.ndarray,
                 distance: int, amplitude: float) -> None:
    """Content-free attention to the token ``distance`` back, through RoPE on constant biases."""
    half = len(theta)
    for j in np.flatnonzero(theta > 0.05):
        q_bias[start + j] = amplitude * np.cos(distance * theta[j])
        q_bias[start + half + j] = -amplitude * np.sin(distance * theta[j])
        k_bias[start + j] = amplitude
