"""What a GGUF file says about its model, checked before anything is written.

Every metadata value the import uses has the type and the range it must have, and the tensors are
exactly the ones the architecture needs, each present once with the shape the metadata implies. A
file that contradicts itself (no tensors, a wrong-size embedding, a duplicated tensor, an epsilon
stored as text, 10⁹ blocks) is refused with one line naming the value, never imported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from localchat.errors import LocalchatError

MAX_TOKENS = 1 << 22
MAX_TEMPLATE_CHARS = 1 << 20


class GgufMetadataError(LocalchatError):
    """The file's metadata is missing, of the wrong type, out of range, or contradicts its tensors."""


@dataclass(frozen=True)
class Hyperparameters:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    eps: float
    context: int
    rope_theta: float


def _need(meta: dict[str, Any], key: str) -> Any:
    if key not in meta:
        raise GgufMetadataError(f"the file has no '{key}'")
    return meta[key]


def _value(meta: dict[str, Any], key: str, default: Any) -> Any:
    return meta[key] if key in meta else _need(meta, key) if default is None else default


def whole(meta: dict[str, Any], key: str, low: int, high: int, default: int | None = None) -> int:
    """An integer value within [low, high] (``default`` when absent and allowed)."""
    value = _value(meta, key, default)
    if type(value) is not int or not low <= value <= high:
        raise GgufMetadataError(f"'{key}' is {value!r}: it must be a whole number from {low} to {high}")
    return value


def number(meta: dict[str, Any], key: str, low: float, high: float, default: float | None = None) -> float:
    """A finite number within (low, high]."""
    value = _value(meta, key, default)
    if type(value) not in (int, float) or not math.isfinite(value) or not low < value <= high:
        raise GgufMetadataError(f"'{key}' is {value!r}: it must be a number above {low:g}, at most {high:g}")
    return float(value)


def hyperparameters(meta: dict[str, Any], arch: str) -> Hyperparameters:
    hidden = whole(meta, f"{arch}.embedding_length", 1, 1 << 16)
    heads = whole(meta, f"{arch}.attention.head_count", 1, 1024)
    kv_heads = whole(meta, f"{arch}.attention.head_count_kv", 1, heads, default=heads)
    if heads % kv_heads:
        raise GgufMetadataError(f"{heads} attention heads cannot share {kv_heads} key/value heads evenly")
    if f"{arch}.attention.key_length" not in meta and hidden % heads:
        raise GgufMetadataError(f"{heads} attention heads do not divide the width {hidden}")
    return Hyperparameters(
        hidden=hidden, heads=heads, kv_heads=kv_heads,
        head_dim=whole(meta, f"{arch}.attention.key_length", 1, 4096, default=hidden // heads),
        layers=whole(meta, f"{arch}.block_count", 1, 1024),
        ffn=whole(meta, f"{arch}.feed_forward_length", 1, 1 << 20),
        eps=number(meta, f"{arch}.attention.layer_norm_rms_epsilon", 0.0, 0.1),
        context=whole(meta, f"{arch}.context_length", 1, 1 << 24, default=4096),
        rope_theta=number(meta, f"{arch}.rope.freq_base", 0.0, 1e12, default=10000.0))


def expected_shapes(h: Hyperparameters, arch: str, vocab: int, names: set[str]) -> dict[str, tuple[int, ...]]:
    """Every tensor the architecture needs (and the optional ones the file has), with its shape."""
    q, kv = h.heads * h.head_dim, h.kv_heads * h.head_dim
    shapes = {"token_embd.weight": (vocab, h.hidden), "output_norm.weight": (h.hidden,)}
    if "output.weight" in names:
        shapes["output.weight"] = (vocab, h.hidden)
    if "rope_freqs.weight" in names and arch == "llama":
        shapes["rope_freqs.weight"] = (h.head_dim // 2,)
    biased = arch == "qwen2" or "blk.0.attn_q.bias" in names
    for i in range(h.layers):
        block = {"attn_norm.weight": (h.hidden,), "attn_q.weight": (q, h.hidden), "attn_k.weight": (kv, h.hidden),
                 "attn_v.weight": (kv, h.hidden), "attn_output.weight": (h.hidden, q), "ffn_norm.weight": (h.hidden,),
                 "ffn_gate.weight": (h.ffn, h.hidden), "ffn_up.weight": (h.ffn, h.hidden),
                 "ffn_down.weight": (h.hidden, h.ffn)}
        if biased:
            block |= {"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)}
        if arch == "qwen3":
            block |= {"attn_q_norm.weight": (h.head_dim,), "attn_k_norm.weight": (h.head_dim,)}
        shapes |= {f"blk.{i}.{name}": shape for name, shape in block.items()}
    return shapes


def check_tensors(tensors: list[Any], h: Hyperparameters, arch: str, vocab: int) -> None:
    """Each needed tensor once, with its shape; nothing else."""
    names = [t.name for t in tensors]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise GgufMetadataError(f"tensor '{duplicated[0]}' appears more than once")
    shapes = expected_shapes(h, arch, vocab, set(names))
    for tensor in tensors:
        if tensor.name not in shapes:
            raise GgufMetadataError(f"tensor '{tensor.name}' has no place in a {arch} model of {h.layers} blocks")
        if tuple(tensor.shape) != shapes[tensor.name]:
            raise GgufMetadataError(f"tensor '{tensor.name}' has the shape {tuple(tensor.shape)}, but the metadata "
                                    f"implies {shapes[tensor.name]}")
    missing = [name for name in shapes if name not in set(names)]
    if missing:
        raise GgufMetadataError(f"the file has no tensor '{missing[0]}' ({len(missing)} missing)")


def tokenizer_fields(meta: dict[str, Any]) -> dict[str, Any]:
    """The tokenizer metadata, each value of its type; lists as long as the vocabulary."""
    tokens = _need(meta, "tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not 0 < len(tokens) <= MAX_TOKENS or not all(isinstance(t, str) for t in tokens):
        raise GgufMetadataError("'tokenizer.ggml.tokens' must be a list of texts")
    n = len(tokens)
    fields: dict[str, Any] = {"tokens": tokens, "model": _text(meta, "tokenizer.ggml.model", None),
              "pre": _text(meta, "tokenizer.ggml.pre", "default"),
              "merges": _list(meta, "tokenizer.ggml.merges", str, None),
              "token_types": _list(meta, "tokenizer.ggml.token_type", int, n) or [1] * n,
              "scores": _list(meta, "tokenizer.ggml.scores", (int, float), n),
              "chat_template": _text(meta, "tokenizer.chat_template", "") or None}
    for name in ("bos", "eos", "padding", "unknown"):
        key = f"tokenizer.ggml.{name}_token_id"
        fields[f"{name}_id"] = whole(meta, key, 0, n - 1) if key in meta else None
    for name in ("add_bos_token", "add_space_prefix"):
        value = meta.get(f"tokenizer.ggml.{name}")
        if value is not None and type(value) is not bool:
            raise GgufMetadataError(f"'tokenizer.ggml.{name}' is {value!r}: it must be true or false")
        fields[name] = value
    if len(fields["chat_template"] or "") > MAX_TEMPLATE_CHARS:
        raise GgufMetadataError("the file's chat template is implausibly long")
    _check_merges(fields["merges"], set(tokens))
    return fields


def _text(meta: dict[str, Any], key: str, default: str | None) -> str:
    value = _value(meta, key, default)
    if not isinstance(value, str):
        raise GgufMetadataError(f"'{key}' is {value!r}: it must be text")
    return value


def _list(meta: dict[str, Any], key: str, kind: type | tuple[type, ...], length: int | None) -> list:
    value = meta.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
        raise GgufMetadataError(f"'{key}' must be a list of {getattr(kind, '__name__', 'numbers')} values")
    if length is not None and len(value) != length:
        raise GgufMetadataError(f"'{key}' has {len(value)} entries for {length} tokens")
    if any(isinstance(v, float) and not math.isfinite(v) for v in value):
        raise GgufMetadataError(f"'{key}' holds a value that is not a finite number")
    return value


def _check_merges(merges: list[str], vocab: set[str]) -> None:
    """Each merge joins two tokens of the vocabulary into a third, as the BPE model needs."""
    for merge in merges:
        left, _, right = merge.partition(" ")
        if not left or not right or {left, right, left + right} - vocab:
            raise GgufMetadataError(f"the merge {merge!r} names tokens that are not in the vocabulary")
