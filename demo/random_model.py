"""Random-weight qwen2 models for benchmarks and tests (any size; real mlx_lm code paths), and a
hybrid one (lfm2: short convolutions with a few attention layers), whose cache cannot be trimmed.

They reuse the demo model's tokenizer and chat template. With ``never_stop`` the output layer
(untied) can only score tokens that are plain ASCII letters, so greedy decoding never ends the
turn and always shows text (never a lone byte of a multi-byte character): the model talks until
--max-tokens, which is what a benchmark of decode speed or a Ctrl+C test needs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from demo.tokenizer import TOKENIZER_FILES
from localchat.demo_codes import MODEL_DIR as DEMO_DIR


def _letter_tokens_mask(vocab_size: int):
    import mlx.core as mx

    vocab = json.loads((DEMO_DIR / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    letters = [i for token, i in vocab.items() if token.isascii() and token.isalpha() and i < vocab_size]
    mask = mx.zeros((vocab_size,))
    mask[mx.array(letters)] = 1.0
    return mask


def _copy_tokenizer(out: Path, max_length: int) -> None:
    """The demo tokenizer, told this model's context length (the demo's 1024 would make
    transformers warn on every long benchmark prompt)."""
    for name in TOKENIZER_FILES:
        if (DEMO_DIR / name).exists():
            shutil.copy(DEMO_DIR / name, out / name)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["model_max_length"] = max_length
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")


def _write_model(out: Path, weights: dict, config: dict) -> None:
    """A loadable MLX model directory at ``out`` (replaced): weights, config, the demo tokenizer."""
    import mlx.core as mx

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    _copy_tokenizer(out, config["max_position_embeddings"])


def build_random_model(out: Path, *, hidden: int, layers: int, intermediate: int, heads: int,
                       kv_heads: int | None = None, dtype: str = "float32", seed: int = 0,
                       never_stop: bool = True, quantize_bits: int | None = None) -> Path:
    """Write a loadable MLX model directory at ``out`` (replaced if present) and return it."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen2

    demo_config = json.loads((DEMO_DIR / "config.json").read_text())
    eos_id = demo_config["eos_token_id"]
    config = {
        "model_type": "qwen2", "hidden_size": hidden, "num_hidden_layers": layers,
        "intermediate_size": intermediate, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads or heads, "head_dim": hidden // heads, "rms_norm_eps": 1e-6,
        "vocab_size": demo_config["vocab_size"], "max_position_embeddings": 4096,
        "rope_theta": 10000.0, "tie_word_embeddings": not never_stop, "eos_token_id": eos_id,
    }
    mx.random.seed(seed)
    model = qwen2.Model(qwen2.ModelArgs.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    if never_stop:
        weights["lm_head.weight"] = weights["lm_head.weight"] * _letter_tokens_mask(demo_config["vocab_size"])[:, None]
    weights = {k: v.astype(getattr(mx, dtype)) for k, v in weights.items()}
    staging = out.with_name(out.name + ".float") if quantize_bits else out
    if out.exists():
        shutil.rmtree(out)
    _write_model(staging, weights, config)
    if quantize_bits:
        from mlx_lm import convert

        convert(str(staging), str(out), quantize=True, q_bits=quantize_bits, q_group_size=64,
                dtype="float32")
        shutil.rmtree(staging)
    return out


def build_hybrid_model(out: Path, *, hidden: int = 64, layers: int = 4, heads: int = 4, seed: int = 0,
                       dtype: str = "float32") -> Path:
    """A random lfm2 model: every other layer a gated short convolution (mlx_lm's ``ArraysCache``,
    which cannot be trimmed), the rest attention. It loads with ``mlx_lm.load`` like a real one."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import lfm2

    demo_config = json.loads((DEMO_DIR / "config.json").read_text())
    config = {
        "model_type": "lfm2", "vocab_size": demo_config["vocab_size"], "hidden_size": hidden,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": heads,
        "max_position_embeddings": 4096, "norm_eps": 1e-5, "conv_bias": False, "conv_L_cache": 3,
        "block_dim": hidden, "block_multiple_of": 16, "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": False, "block_ff_dim": 2 * hidden,
        "full_attn_idxs": list(range(1, layers, 2)), "eos_token_id": demo_config["eos_token_id"],
        "tie_word_embeddings": True,
    }
    mx.random.seed(seed)
    model = lfm2.Model(lfm2.ModelArgs.from_dict(config))
    _write_model(out, {k: v.astype(getattr(mx, dtype)) for k, v in tree_flatten(model.parameters())}, config)
    return out
