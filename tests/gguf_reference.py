"""For the import tests: synthetic GGUF files written with gguf-py, and a float64 numpy forward
pass of a GGUF's own dequantized weights (Hugging Face layout) to compare the imported model with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

T = gguf.GGMLQuantizationType



def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes (as tokenizers' ByteLevel uses them)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def tiny_vocab() -> tuple[list[str], list[str], list[int]]:
    alphabet = byte_alphabet()
    merges = ["h e", "l l", "he ll", "Ġ w", "o r"]
    merged = ["he", "ll", "hell", "Ġw", "or"]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = specials + alphabet + merged
    types = [3] * len(specials) + [1] * (len(alphabet) + len(merged))
    return tokens, merges, types


TEMPLATE = ("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n'}}{% endfor %}"
            "{% if add_generation_prompt %}{{'<|im_start|>assistant\n'}}{% endif %}")


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's converter does to llama's q/k rows (HF order → interleaved)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path, arch: str, kind: str, *, seed: int = 0, hidden: int = 64, layers: int = 2,
                    heads: int = 4, kv_heads: int = 2, ffn: int = 128,
                    rope_factors: np.ndarray | None = None, spm=None, mutate=None) -> dict[str, np.ndarray]:
    """A random model of ``arch`` whose matrices are stored as ``kind``; returns the HF-layout float
    weights the GGUF holds once dequantized (the reference's weights). ``mutate(writer)`` may change
    the metadata and tensors just before they are written (for the fault corpus)."""
    rng = np.random.default_rng(seed)
    tokens, merges, types = tiny_vocab() if spm is None else (spm.tokens, [], spm.types)
    vocab = len(tokens)
    head_dim = 64 if arch == "qwen3" else hidden // heads  # qwen3 may set key_length apart from hidden/heads
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(layers)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    if arch == "qwen3":
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_tokenizer_model("gpt2" if spm is None else "llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    if spm is None:
        writer.add_token_merges(merges)
    else:
        writer.add_token_scores(spm.scores)
        writer.add_add_space_prefix(True)
    writer.add_token_types(types)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(TEMPLATE)
    reference: dict[str, np.ndarray] = {}

    def tensor(gguf_name: str, hf: str, shape: tuple[int, ...], stored: str, scale: float = 0.08,
               permute_heads: int | None = None) -> None:
        values = (rng.standard_normal(shape) * scale).astype(np.float32)
        if hf.endswith("norm.weight"):
            values = 1.0 + values
        on_disk = permute(values, permute_heads) if permute_heads else values
        raw, qtype = encode(on_disk, stored, rng)
        writer.add_tensor(gguf_name, raw, raw_shape=raw.shape, raw_dtype=qtype)
        back = gguf.quants.dequantize(raw, qtype).reshape(shape).astype(np.float64)
        reference[hf] = permute_back(back, permute_heads) if permute_heads else back

    tensor("token_embd.weight", "model.embed_tokens.weight", (vocab, hidden), kind)
    for i in range(layers):
        p, b = f"blk.{i}.", f"model.layers.{i}."
        llama = arch == "llama"
        tensor(p + "attn_norm.weight", b + "input_layernorm.weight", (hidden,), "F32")
        tensor(p + "attn_q.weight", b + "self_attn.q_proj.weight", (heads * head_dim, hidden), kind,
               permute_heads=heads if llama else None)
        tensor(p + "attn_k.weight", b + "self_attn.k_proj.weight", (kv_heads * head_dim, hidden), kind,
               permute_heads=kv_heads if llama else None)
        tensor(p + "attn_v.weight", b + "self_attn.v_proj.weight", (kv_heads * head_dim, hidden), kind)
        tensor(p + "attn_output.weight", b + "self_attn.o_proj.weight", (hidden, heads * head_dim), kind)
        if arch == "qwen2":
            for x, n in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
                tensor(p + f"attn_{x}.bias", b + f"self_attn.{x}_proj.bias", (n * head_dim,), "F32")
        if arch == "qwen3":
            tensor(p + "attn_q_norm.weight", b + "self_attn.q_norm.weight", (head_dim,), "F32")
            tensor(p + "attn_k_norm.weight", b + "self_attn.k_norm.weight", (head_dim,), "F32")
        tensor(p + "ffn_norm.weight", b + "post_attention_layernorm.weight", (hidden,), "F32")
        tensor(p + "ffn_gate.weight", b + "mlp.gate_proj.weight", (ffn, hidden), kind)
        tensor(p + "ffn_up.weight", b + "mlp.up_proj.weight", (ffn, hidden), kind)
        tensor(p + "ffn_down.weight", b + "mlp.down_proj.weight", (hidden, ffn), kind)
    tensor("output_norm.weight", "model.norm.weight", (hidden,), "F32")
    if rope_factors is not None:
        writer.add_tensor("rope_freqs.weight", rope_factors.astype(np.float32))
        reference["rope_factors"] = rope_factors.astype(np.float64)
    if mutate is not None:
        mutate(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reference["config"] = np.array([heads, kv_heads, head_dim])
    return reference


def permute_back(w: np.ndarray, heads: int) -> np.ndarray:
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def encode(values: np.ndarray, kind: str, rng) -> tuple[np.ndarray, T]:
    """``values`` in GGML type ``kind``: gguf-py's quantizer where it has one, else random blocks
    with sane float16 scales (the K-quants)."""
    qtype = T[kind]
    if kind == "F32":
        return values, qtype
    if kind == "F16":
        return values.astype(np.float16), qtype
    try:
        return gguf.quants.quantize(values, qtype), qtype
    except (NotImplementedError, gguf.quants.QuantError):
        return random_blocks(values.shape, qtype, rng), qtype


def random_blocks(shape: tuple[int, ...], qtype: T, rng) -> np.ndarray:
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = shape[0], int(np.prod(shape[1:]))
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    d = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)
    if qtype in (T.Q4_K, T.Q5_K):
        raw[..., 0:2], raw[..., 2:4] = d, np.frombuffer(np.float16(0.001).tobytes(), np.uint8)
    elif qtype == T.Q6_K:
        raw[..., -2:] = d
    return raw.reshape(rows, -1)


def forward(weights: dict[str, np.ndarray], ids: list[int], arch: str, eps: float = 1e-5,
            theta: float = 10000.0) -> np.ndarray:
    """Logits of every position, in float64: HF llama/qwen2/qwen3 (rotate-half RoPE, GQA, SwiGLU)."""
    heads, kv_heads, head_dim = (int(x) for x in weights["config"])
    w = weights
    x = w["model.embed_tokens.weight"][ids]
    n = len(ids)
    inv = theta ** (-np.arange(0, head_dim, 2) / head_dim) / w.get("rope_factors", 1.0)
    angles = np.outer(np.arange(n), inv)
    cos, sin = np.cos(np.concatenate([angles, angles], -1)), np.sin(np.concatenate([angles, angles], -1))

    def norm(v, g):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * g

    def rope(v):
        half = v.shape[-1] // 2
        rotated = np.concatenate([-v[..., half:], v[..., :half]], -1)
        return v * cos[:, None, :] + rotated * sin[:, None, :]

    layers = len({k.split(".")[2] for k in w if k.startswith("model.layers.")})  # noqa: C401
    for i in range(layers):
        b = f"model.layers.{i}."
        h = norm(x, w[b + "input_layernorm.weight"])
        q = h @ w[b + "self_attn.q_proj.weight"].T + w.get(b + "self_attn.q_proj.bias", 0)
        k = h @ w[b + "self_attn.k_proj.weight"].T + w.get(b + "self_attn.k_proj.bias", 0)
        v = h @ w[b + "self_attn.v_proj.weight"].T + w.get(b + "self_attn.v_proj.bias", 0)
        q, k, v = (t.reshape(n, -1, head_dim) for t in (q, k, v))
        if arch == "qwen3":
            q, k = norm(q, w[b + "self_attn.q_norm.weight"]), norm(k, w[b + "self_attn.k_norm.weight"])
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, heads // kv_heads, axis=1), np.repeat(v, heads // kv_heads, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(head_dim)
        scores = scores + np.triu(np.full((n, n), -np.inf), 1)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(n, -1)
        x = x + attn @ w[b + "self_attn.o_proj.weight"].T
        h = norm(x, w[b + "post_attention_layernorm.weight"])
        gate, up = h @ w[b + "mlp.gate_proj.weight"].T, h @ w[b + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[b + "mlp.down_proj.weight"].T
    x = norm(x, w["model.norm.weight"])
    return x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T


def llama3_factors(head_dim: int, theta: float = 10000.0, factor: float = 32.0) -> np.ndarray:
    """llama.cpp's rope_freqs for Llama 3's scaling (low 1, high 4, original context 8192)."""
    out = []
    for freq in theta ** (-np.arange(0, head_dim, 2) / head_dim):
        wavelen = 2 * np.pi / freq
        if wavelen < 8192 / 4:
            out.append(1.0)
        elif wavelen > 8192:
            out.append(factor)
        else:
            smooth = (8192 / wavelen - 1) / 3
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out)


@dataclass
class SentencePieceVocab:
    processor: object
    tokens: list[str]
    scores: list[float]
    types: list[int]


def train_sentencepiece(vocab_size: int = 300) -> SentencePieceVocab:
    """A small SentencePiece BPE model trained as Llama's was (identity normalization, spaces
    kept, digits split, byte fallback), with its pieces, scores and GGUF token types."""
    import io
    import random

    import sentencepiece as spm

    rng = random.Random(0)
    words = ("the quick brown fox jumps over the lazy dog harbor river falcon maple copper violet "
             "summit canyon lantern meadow 12345 67 hello world 港口 河流 月亮").split()
    corpus = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(3000)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_writer=model, vocab_size=vocab_size, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, bos_id=1, eos_id=2, unk_id=0, pad_id=-1,
        normalization_rule_name="identity", remove_extra_whitespaces=False, split_digits=True,
        allow_whitespace_only_pieces=True, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    n = sp.get_piece_size()
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1 for i in range(n)]
    return SentencePieceVocab(sp, [sp.id_to_piece(i) for i in range(n)], [sp.get_score(i) for i in range(n)], types)
