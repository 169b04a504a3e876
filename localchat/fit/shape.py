"""What a model's memory depends on: its config's shape and its weights' bytes.

The weights come from the safetensors headers (the tensors' byte ranges), never from loading
them: on this machine ``huggingface_hub.get_local_safetensors_metadata`` reads a directory's
headers; before a download, ``HfApi.get_safetensors_metadata`` reads them with ranged requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localchat.errors import LocalchatError
from localchat.registry import CONTEXT_KEYS, context_length, positive

DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U32": 4, "I16": 2, "U16": 2,
               "I8": 1, "U8": 1, "BOOL": 1}
FLOAT_DTYPES = ("F32", "F16", "BF16")
MAX_TENSOR_BYTES = 10**15  # a petabyte: past any tensor
# past any published model (the largest have ~100 layers, hidden sizes of ~16k, vocabularies of ~260k);
# a config beyond these is not a model's, and mlx_lm's ModelArgs would build a list per layer of it
LIMITS = {"num_hidden_layers": 4096, "n_layer": 4096, "num_layers": 4096, "hidden_size": 1 << 20, "n_embd": 1 << 20,
          "d_model": 1 << 20, "num_attention_heads": 1 << 16, "n_head": 1 << 16, "num_key_value_heads": 1 << 16,
          "n_head_kv": 1 << 16, "head_dim": 1 << 16, "intermediate_size": 1 << 24, "n_inner": 1 << 24,
          "vocab_size": 1 << 26, "sliding_window": 1 << 32, "sliding_window_pattern": 4096}


@dataclass(frozen=True)
class ModelShape:
    """The numbers the estimate multiplies; ``global_layers`` attend to the whole context, the
    others (Gemma 3's sliding layers) to ``sliding_window`` tokens at most."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    weights_bytes: int
    activation_bytes: int  # the float the model computes in: its scales' or its weights' dtype
    global_layers: int
    sliding_window: int | None = None
    context_window: int | None = None
    last_layer_global: bool = True  # Gemma 3 with a multiple of 6 layers ends on a global one


# each number the estimate reads, by any of its names (a Gemma 3's sliding pattern besides: ``_sliding``)
COUNTS = (("num_hidden_layers", "n_layer", "num_layers"), ("hidden_size", "n_embd", "d_model"),
          ("num_attention_heads", "n_head"), ("num_key_value_heads", "n_head_kv"), ("head_dim",),
          ("intermediate_size", "n_inner"), ("vocab_size",), CONTEXT_KEYS)


def _as_written(config: dict[str, Any]) -> dict[str, Any]:
    """The config with its language model's part (``text_config``) over it."""
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def _states_every_count(part: dict[str, Any]) -> bool:
    """Whether the config itself gives every number the estimate reads (then mlx_lm, which takes
    a stated number as it is, would fill in nothing)."""
    sliding = str(part.get("model_type", "")).startswith("gemma3") and part.get("sliding_window") is not None
    needed = COUNTS + ((("sliding_window_pattern",),) if sliding else ())
    return all(positive(part, *names) is not None for names in needed)


def _as_mlx_lm_reads(config: dict[str, Any]) -> dict[str, Any]:
    """The config's numbers as mlx_lm builds the model from them: its ``ModelArgs`` fill in what a
    published config leaves out (Gemma 3 4B names no head counts), and a multimodal config's
    language model is its ``text_config``. A type mlx_lm does not know is read as written. mlx_lm
    (1.4 s to import here, with transformers) is asked only when the config leaves a number out."""
    if _states_every_count(_as_written(config)):
        return _as_written(config)
    from mlx_lm.utils import _get_classes

    def args_of(part: dict[str, Any]) -> dict[str, Any]:
        try:
            return {**part, **vars(_get_classes(part)[1].from_dict(part))}
        except Exception:  # a model type mlx_lm lacks, or args it refuses: the config as it is
            return dict(part)

    read = args_of(config)
    text = read.get("text_config")
    return {**read, **args_of(text)} if isinstance(text, dict) and text.get("model_type") else \
        {**read, **text} if isinstance(text, dict) else read


def _check_limits(config: dict[str, Any]) -> None:
    for part in (config, config.get("text_config")):
        if not isinstance(part, dict):
            continue
        for name, limit in LIMITS.items():
            value = part.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not value <= limit:
                raise LocalchatError(f"cannot estimate its memory: config.json says {name} is {str(value)[:40]}, "
                                     f"past any model's ({limit:,}); not a model's config")


def _sliding(part: dict[str, Any], layers: int) -> tuple[int, int | None, bool]:
    """(layers over the whole context, the window of the others, whether the last is global), as
    mlx_lm builds their caches: Gemma 3 makes every ``sliding_window_pattern``-th layer global."""
    window = positive(part, "sliding_window")
    model_type = str(part.get("model_type", ""))
    if window is None or not model_type.startswith("gemma3"):
        return layers, None, True
    pattern = positive(part, "sliding_window_pattern") or 6
    return layers // pattern, window, layers % pattern == 0


def _activation_bytes(tensors: dict[str, tuple[str, int]]) -> int:
    """A quantized model computes in its scales' dtype; a plain one in its weights' float dtype."""
    scales = [dtype for name, (dtype, _) in tensors.items() if name.endswith(".scales")]
    floats = scales or [dtype for dtype, _ in tensors.values() if dtype in FLOAT_DTYPES]
    return DTYPE_BYTES.get(max(set(floats), key=floats.count), 2) if floats else 2


def shape_from(config: dict[str, Any], tensors: dict[str, tuple[str, int]]) -> ModelShape:
    """``tensors`` maps each tensor's name to (safetensors dtype, bytes)."""
    _check_limits(config)
    part = _as_mlx_lm_reads(config)
    layers = positive(part, "num_hidden_layers", "n_layer", "num_layers")
    hidden = positive(part, "hidden_size", "n_embd", "d_model")
    heads = positive(part, "num_attention_heads", "n_head")
    vocab = positive(part, "vocab_size")
    if layers is None or hidden is None or heads is None or vocab is None or not tensors:
        raise LocalchatError("cannot estimate its memory: config.json lacks the layer, hidden size, head or "
                             "vocabulary numbers, or it has no safetensors weights")
    kv_heads = positive(part, "num_key_value_heads", "n_head_kv") or heads
    global_layers, window, last_global = _sliding(part, layers)
    return ModelShape(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                      head_dim=positive(part, "head_dim") or hidden // heads,
                      intermediate=positive(part, "intermediate_size", "n_inner") or 4 * hidden,
                      vocab=vocab, weights_bytes=sum(size for _, size in tensors.values()),
                      activation_bytes=_activation_bytes(tensors), global_layers=global_layers,
                      sliding_window=window, context_window=context_length(part), last_layer_global=last_global)


def _tensor(file: str, name: str, info: Any) -> tuple[str, int]:
    """(dtype, bytes) of one header entry, refused when its byte range is not one: offsets that are
    not two ordered counts would make a negative or absurd estimate that "fits"."""
    offsets = info.data_offsets
    if not (isinstance(offsets, (list, tuple)) and len(offsets) == 2
            and all(type(at) is int for at in offsets) and 0 <= offsets[0] <= offsets[1] <= MAX_TENSOR_BYTES):
        raise LocalchatError(f"cannot estimate its memory: {file}'s header gives tensor {name[:60]!r} the byte "
                             f"range {str(offsets)[:60]}, which is not one")
    return (info.dtype if isinstance(info.dtype, str) else "?"), offsets[1] - offsets[0]


def tensors_of(headers: dict[str, Any]) -> dict[str, tuple[str, int]]:
    """{file: huggingface_hub's ``SafetensorsFileMetadata``} → {tensor: (dtype, bytes)}."""
    return {name: _tensor(file, str(name), info) for file, header in headers.items()
            for name, info in header.tensors.items()}


def local_shape(model_dir: Any) -> ModelShape:
    """The shape of a model directory on this machine, from its config and weight headers."""
    from huggingface_hub import get_local_safetensors_metadata

    from localchat.registry import check_model_dir, read_config

    check_model_dir(Path(model_dir), str(model_dir))  # (a FIFO among the weights would block the read)
    try:
        metadata = get_local_safetensors_metadata(model_dir)
    except Exception as exc:  # a missing index, an unreadable header: one line
        raise LocalchatError(f"cannot read the weights' headers in {model_dir}: {exc}".splitlines()[0]) from None
    return shape_from(read_config(model_dir), tensors_of(metadata.files_metadata))
