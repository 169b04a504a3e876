"""The memory a model takes at a context: weights + KV cache + the prefill's working memory + a
measured runtime overhead, the way mlx_lm allocates them (``scripts/bench_memory.py`` compares
every term's sum with MLX's measured peak).

The KV cache grows in steps of 256 tokens (mlx_lm's ``KVCache.step``) and, while a step is
added, one layer's cache exists twice. The prefill runs in chunks of 2048 tokens (mlx_lm's
``prefill_step_size``); the last chunk attends to the whole context. Where attention is not
fused (the CPU, a quantized KV cache, a head size Metal's kernel does not take) its scores and
mask are materialized: heads × chunk × context values each.
"""

from __future__ import annotations

from dataclasses import dataclass

from localchat.fit.shape import ModelShape

KV_STEP = 256
PREFILL_STEP = 2048
FUSED_HEAD_DIMS = (64, 80, 128)  # Metal's fused prefill attention (mlx's steel attention kernel)
RUNTIME_OVERHEAD_BYTES = 2**20  # measured: the median of what the terms below leave out (norms, RoPE, sampling)
HIDDEN_COPIES = 6  # the residual, the normed input, q, attention output, its projection, the sum


@dataclass(frozen=True)
class KVSettings:
    """What changes the KV cache: ``--kv-bits`` (with its group) and ``--max-kv-size``."""

    bits: int | None = None
    group_size: int = 64
    max_tokens: int | None = None
    quantized_start: int = 0  # --quantized-kv-start: the cache stays full precision until past it
    on_write: bool = False  # serve's engine: each token quantized as it is written, never held at full precision


@dataclass(frozen=True)
class MemoryEstimate:
    context: int
    weights: int
    kv_cache: int
    prefill: int
    overhead: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.prefill + self.overhead


def _round_up(tokens: int, step: int = KV_STEP) -> int:
    return -(-tokens // step) * step


def _kv_value_bytes(shape: ModelShape, kv: KVSettings) -> float:
    """One cached key or value element: the activation dtype, or packed bits plus each group's
    scale and bias."""
    if kv.bits is None:
        return shape.activation_bytes
    return kv.bits / 8 + 2 * shape.activation_bytes / kv.group_size


def _layer_tokens(shape: ModelShape, context: int, kv: KVSettings) -> list[int]:
    """The tokens each layer's cache holds at ``context`` (allocated in whole steps)."""
    full = min(context, kv.max_tokens) if kv.max_tokens else context
    tokens = [_round_up(full)] * shape.global_layers
    if shape.sliding_window is not None:
        window = min(context, shape.sliding_window + PREFILL_STEP - 1)  # a rotating cache keeps a chunk more
        tokens += [window] * (shape.layers - shape.global_layers)
    return tokens


def kv_cache_bytes(shape: ModelShape, context: int, kv: KVSettings = KVSettings()) -> int:
    """layers × 2 (keys, values) × KV heads × head dim × tokens × bytes per value. A quantized cache
    is quantized between prefill chunks once past its start, and the peak stays a full-precision
    cache's until two chunks past it (measured: SmolLM2 at 4096 tokens peaks as high with
    ``--kv-bits 8`` as without); the larger of the two is its peak. Serve's engine quantizes each
    token as it is written (``on_write``): its cache is full precision only before its start."""
    per_token = 2 * shape.kv_heads * shape.head_dim * _kv_value_bytes(shape, kv)
    held = int(sum(_layer_tokens(shape, context, kv)) * per_token)
    if kv.bits is None or (kv.on_write and context <= kv.quantized_start):
        return held if kv.bits is None else kv_cache_bytes(shape, context, KVSettings(max_tokens=kv.max_tokens))
    if kv.on_write:  # (at its start, the full-precision cache and its quantized copy exist at once)
        start = kv.quantized_start
        return max(held, kv_cache_bytes(shape, start, KVSettings(max_tokens=kv.max_tokens)) + int(
            sum(_layer_tokens(shape, start, kv)) * per_token)) if start else held
    before = min(context, kv.quantized_start + 2 * PREFILL_STEP)
    return max(held, kv_cache_bytes(shape, before, KVSettings(max_tokens=kv.max_tokens)))


def _attention_bytes(shape: ModelShape, chunk: int, context: int, fused: bool) -> int:
    if fused:
        return 0
    return chunk * context * (shape.heads * shape.activation_bytes + 1)  # the scores, and the boolean mask


def _attended(shape: ModelShape, context: int, chunk: int, kv: KVSettings) -> int:
    """The most tokens a layer attends to while prefilling. MLX evaluates only the caches between
    chunks, so the last layer's attention is never computed there: when it is the only global
    layer (a 6-layer Gemma 3), the widest attention is a sliding layer's window and chunk."""
    full = min(context, kv.max_tokens) if kv.max_tokens else context
    if shape.sliding_window is None or shape.global_layers - shape.last_layer_global > 0:
        return full
    return min(full, shape.sliding_window + chunk)


def prefill_bytes(shape: ModelShape, context: int, kv: KVSettings = KVSettings(), metal: bool = False) -> int:
    """The last prefill chunk's working memory: attention, the MLP's three activations, the hidden
    states, one layer's KV cache copied while it grows, and the logits of the token sampled."""
    chunk = max(1, min(PREFILL_STEP, context - 1))
    attended = _attended(shape, context, chunk, kv)
    fused = metal and kv.bits is None and shape.head_dim in FUSED_HEAD_DIMS
    projections = shape.hidden * HIDDEN_COPIES + (shape.heads + 2 * shape.kv_heads) * shape.head_dim
    per_token = (3 * shape.intermediate + projections) * shape.activation_bytes
    layer_kv = max(_layer_tokens(shape, context, kv), default=0) * 2 * shape.kv_heads * shape.head_dim
    return int(_attention_bytes(shape, chunk, attended, fused) + chunk * per_token
               + layer_kv * _kv_value_bytes(shape, kv) + shape.vocab * 4 * 2)


def estimate(shape: ModelShape, context: int, kv: KVSettings = KVSettings(), metal: bool = False) -> MemoryEstimate:
    """The peak a load and a prefill of ``context`` tokens reach, term by term."""
    return MemoryEstimate(context=context, weights=shape.weights_bytes, kv_cache=kv_cache_bytes(shape, context, kv),
                          prefill=prefill_bytes(shape, context, kv, metal), overhead=RUNTIME_OVERHEAD_BYTES)
