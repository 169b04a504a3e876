"""``localchat import FILE.gguf``: a GGUF file as an MLX model directory that mlx_lm loads.

``reader`` gives every tensor's type and raw blocks, which ``tensors`` maps to MLX, and the
metadata, from which the config and tokenizer are rebuilt. (``mx.load`` reads GGUF too, but turns
the K-quants into float16, which is not the model that was shipped.) llama.cpp's converter interleaves the rows of
llama's q/k projections for its RoPE; they are put back in Hugging Face order, so the directory
is a plain mlx_lm llama. The directory is written next to its final place and renamed into it:
an import that fails leaves nothing behind.
"""

from __future__ import annotations

import errno
import json
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from localchat.errors import LocalchatError
from localchat.gguf.reader import GgufFile
from localchat.gguf.tensors import Quantized, non_finite, to_mlx
from localchat.gguf.tokenizer import TokenizerSpec, build_tokenizer, check_tokenizer, save_tokenizer
from localchat.gguf.validate import Hyperparameters, check_tensors, hyperparameters, tokenizer_fields
from localchat.wording import count

ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
SHARD_BYTES = 16 * 2**20


class GgufImportError(LocalchatError):
    """The file cannot be imported faithfully; nothing was written."""


@dataclass
class ImportReport:
    name: str
    directory: Path
    source: Path
    architecture: str
    parameters: int
    tensor_types: dict[str, int] = field(default_factory=dict)
    bits: int | None = None
    size_bytes: int = 0
    max_error: dict[str, float] = field(default_factory=dict)  # tensors stored in a nearest form


def tokenizer_spec(meta: dict[str, Any], h: Hyperparameters) -> TokenizerSpec:
    fields = tokenizer_fields(meta)
    return TokenizerSpec(
        model=fields["model"], pre=fields["pre"], tokens=fields["tokens"], merges=fields["merges"],
        token_types=fields["token_types"], scores=fields["scores"],
        add_space_prefix=fields["add_space_prefix"] if fields["add_space_prefix"] is not None
        else fields["model"] == "llama",
        bos_id=fields["bos_id"], eos_id=fields["eos_id"], pad_id=fields["padding_id"], unk_id=fields["unknown_id"],
        add_bos=bool(fields["add_bos_token"]), chat_template=fields["chat_template"], context_length=h.context)


def model_config(h: Hyperparameters, arch: str, names: set[str], spec: TokenizerSpec) -> dict[str, Any]:
    """mlx_lm's config.json from the GGUF's (checked) hyperparameters."""
    config = {
        "model_type": ARCHITECTURES[arch], "hidden_size": h.hidden, "num_hidden_layers": h.layers,
        "intermediate_size": h.ffn, "num_attention_heads": h.heads, "num_key_value_heads": h.kv_heads,
        "rms_norm_eps": h.eps, "vocab_size": len(spec.tokens), "max_position_embeddings": h.context,
        "rope_theta": h.rope_theta, "head_dim": h.head_dim, "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names, "mlp_bias": False,
    }
    if spec.eos_id is not None:
        config["eos_token_id"] = spec.eos_id
    return config


LLAMA3_SCALING = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def llama3_rope_scaling(factors: np.ndarray, head_dim: int, theta: float) -> dict[str, Any]:
    """Llama 3.x's RoPE scaling, from the ``rope_freqs`` tensor llama.cpp stores (one divisor per
    frequency): its largest divisor is the factor; the rest must be what Meta's formula gives with
    the published low/high frequency factors and original context, or the file is refused."""
    import math

    factor = float(factors.max())
    low, high, original = (LLAMA3_SCALING[k] for k in ("low_freq_factor", "high_freq_factor",
                                                       "original_max_position_embeddings"))
    expected = []
    for freq in theta ** (-np.arange(0, head_dim, 2) / head_dim):
        wavelen = 2 * math.pi / freq
        if wavelen < original / high:
            expected.append(1.0)
        elif wavelen > original / low:
            expected.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            expected.append(1 / ((1 - smooth) / factor + smooth))
    if factors.shape != (head_dim // 2,) or not np.allclose(factors, expected, rtol=1e-4):
        raise GgufImportError("the rope_freqs tensor is not Llama 3's RoPE scaling with its published "
                              "parameters; it cannot be imported faithfully")
    return {"rope_type": "llama3", "factor": factor, **LLAMA3_SCALING}


def hf_name(gguf_name: str) -> str | None:
    """``blk.3.attn_q.weight`` → ``model.layers.3.self_attn.q_proj.weight``."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in TOP_NAMES:
        return f"{TOP_NAMES[parts[0]]}.{parts[1]}"
    return None


def unpermute_rows(value: np.ndarray | Quantized, heads: int) -> np.ndarray | Quantized:
    """Undo llama.cpp's interleaving of each head's rows (q and k of llama only)."""
    def rows(a: np.ndarray) -> np.ndarray:
        return a.reshape(heads, a.shape[0] // heads // 2, 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)

    if isinstance(value, Quantized):
        return Quantized(weight=rows(value.weight), scales=rows(value.scales), biases=rows(value.biases),
                         bits=value.bits, group_size=value.group_size, max_error=value.max_error)
    return rows(value)


def scale_dtype() -> Any:
    """float32 scales on Linux (the CPU wheel runs float16 scales ~45× slower); as stored on a Mac."""
    import mlx.core as mx

    return mx.float16 if sys.platform == "darwin" else mx.float32


def converted_tensors(reader: GgufFile, h: Hyperparameters, arch: str, report: ImportReport,
                      quant: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Each tensor as its MLX arrays, one at a time (so memory holds one tensor, not the model);
    ``report`` and ``quant`` (the per-layer quantization) fill in as it goes. The tensors were
    checked against the architecture (``validate.check_tensors``) before this runs."""
    import mlx.core as mx

    for tensor in reader.tensors:
        if tensor.name == "rope_freqs.weight":  # read into the config (see llama3_rope_scaling)
            continue
        name = hf_name(tensor.name)
        if name is None:
            continue
        report.tensor_types[tensor.kind] = report.tensor_types.get(tensor.kind, 0) + 1
        value = to_mlx(tensor.kind, reader.raw(tensor), tensor.shape)
        reader.release(tensor)
        if bad := non_finite(value):
            raise GgufImportError(f"tensor {tensor.name} holds {count(bad, 'number')} that are not finite (inf or "
                                  "NaN): the file is damaged")
        if arch == "llama" and tensor.name.endswith(("attn_q.weight", "attn_k.weight")):
            value = unpermute_rows(value, h.heads if "attn_q" in tensor.name else h.kv_heads)
        if not isinstance(value, Quantized):
            yield name, mx.array(value)
            continue
        base = name.removesuffix(".weight")
        quant[base] = {"group_size": value.group_size, "bits": value.bits}
        if value.max_error:
            report.max_error[tensor.name] = value.max_error
        yield name, mx.array(value.weight)
        yield f"{base}.scales", mx.array(value.scales).astype(scale_dtype())
        yield f"{base}.biases", mx.array(value.biases).astype(scale_dtype())


def quantization_block(quant: dict[str, Any]) -> dict[str, Any] | None:
    """The config's ``quantization``: the most common bits as the default, the others per layer."""
    if not quant:
        return None
    common = Counter((q["group_size"], q["bits"]) for q in quant.values()).most_common(1)[0][0]
    block: dict[str, Any] = {"group_size": common[0], "bits": common[1]}
    block |= {path: q for path, q in quant.items() if (q["group_size"], q["bits"]) != common}
    return block


def write_shards(arrays: Iterator[tuple[str, Any]], directory: Path) -> None:
    """``model-N.safetensors`` files of ~``SHARD_BYTES`` each, written as the arrays come (only
    one shard is in memory), and the index mlx_lm reads."""
    import mlx.core as mx

    index: dict[str, str] = {}
    shard: dict[str, Any] = {}

    def flush() -> None:
        file = f"model-{len(set(index.values())) + 1:05d}.safetensors"
        try:
            mx.save_safetensors(str(directory / file), shard, metadata={"format": "mlx"})
        except RuntimeError as exc:  # MLX's own writer: "[write] Unable to write N bytes to file." (a full disk)
            raise OSError(errno.ENOSPC, f"{file}: {str(exc).splitlines()[0]} (is the disk full?)") from None
        index.update({name: file for name in shard})
        shard.clear()

    for name, value in arrays:
        shard[name] = value
        if sum(v.nbytes for v in shard.values()) > SHARD_BYTES:
            flush()
    if shard:
        flush()
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}, indent=1))


def import_gguf(source: Path, destination: Path, *, on_progress: Callable[[int, int, str], None] = lambda *_: None
                ) -> ImportReport:
    """Convert ``source`` into ``destination`` (which must not exist yet)."""
    try:
        reader = GgufFile(source)
    except OSError as exc:
        raise GgufImportError(f"cannot read {source}: {exc.strerror or exc}") from None
    try:
        return _convert(reader, source, destination, on_progress)
    except OSError as exc:  # no space, a read-only home, or another import of this name finished first
        raise GgufImportError(f"cannot write {destination}: {exc.strerror or exc}; nothing was imported") from None
    finally:
        reader.close()


def _convert(reader: GgufFile, source: Path, destination: Path, on_progress: Callable[[int, int, str], None]
             ) -> ImportReport:
    meta = reader.metadata
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GgufImportError(f"architecture '{arch}' cannot be imported (supported: {', '.join(ARCHITECTURES)})")
    h = hyperparameters(meta, arch)
    spec = tokenizer_spec(meta, h)
    check_tokenizer(spec)
    check_tensors(reader.tensors, h, arch, len(spec.tokens))
    config = model_config(h, arch, {t.name for t in reader.tensors}, spec)
    rope = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if rope is not None:
        factors = to_mlx(rope.kind, reader.raw(rope), rope.shape)
        config["rope_scaling"] = llama3_rope_scaling(np.asarray(factors), h.head_dim, h.rope_theta)
    report = ImportReport(name=destination.name, directory=destination, source=source, architecture=arch,
                          parameters=sum(int(t.n_elements) for t in reader.tensors if t.name != "rope_freqs.weight"))
    quant: dict[str, Any] = {}
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}-", dir=destination.parent))
    try:
        # the tokenizer first: a template that cannot be used is refused before any conversion
        save_tokenizer(usable_tokenizer(spec, destination.name), staging, spec)
        write_shards(_counted(converted_tensors(reader, h, arch, report, quant), len(reader.tensors),
                              on_progress), staging)
        if block := quantization_block(quant):
            config["quantization"] = config["quantization_config"] = block
            report.bits = block["bits"]
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        report.size_bytes = sum(p.stat().st_size for p in staging.iterdir())
        (staging / "import.json").write_text(json.dumps(_as_json(report), indent=2))
        staging.chmod(0o755)
        staging.rename(destination)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return report


def usable_tokenizer(spec: TokenizerSpec, name: str) -> Any:
    """The rebuilt tokenizer, its chat template tried on a first message (with its time limit)."""
    from localchat.templates.render import ChatTemplate, TemplateError

    try:
        tokenizer = build_tokenizer(spec)
    except LocalchatError:
        raise
    except Exception as exc:  # the tokenizers library's own refusal of a vocabulary
        raise GgufImportError(f"the file's tokenizer cannot be rebuilt: {str(exc).splitlines()[0]}") from None
    if spec.chat_template:
        try:
            ChatTemplate(tokenizer, name).text([{"role": "user", "content": "Hello"}])
        except TemplateError as exc:
            raise GgufImportError(f"{exc}; nothing was imported") from None
    return tokenizer


def _counted(arrays: Iterator[tuple[str, Any]], tensors: int, on_progress: Callable[[int, int, str], None]
             ) -> Iterator[tuple[str, Any]]:
    """The arrays, telling ``on_progress`` (done, total, name) as each tensor's weight passes."""
    done = 0
    for name, value in arrays:
        if not name.endswith((".scales", ".biases")):
            done += 1
            on_progress(done, tensors, name)
        yield name, value


def _as_json(report: ImportReport) -> dict[str, Any]:
    return {"source": str(report.source), "architecture": report.architecture, "tensor_types": report.tensor_types,
            "bits": report.bits, "parameters": report.parameters, "max_error": report.max_error}
