"""mlx_lm's own features, reached in-process through mlx_lm's own functions.

``RuntimeOptions`` are fixed when the model is loaded: a LoRA adapter (``load(adapter_path=)``), a
draft model for speculative decoding (``stream_generate(draft_model=, num_draft_tokens=)``), a
quantized KV cache (``kv_bits``, ``kv_group_size``, ``quantized_kv_start``) and a bounded, rotating
one (``make_prompt_cache(max_kv_size=)``). The sampling settings of ``GenerationParams`` become
``make_sampler`` and ``make_logits_processors``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from localchat.backends import GenerationParams
from localchat.errors import LocalchatError, UsageError

KV_BITS = (2, 3, 4, 5, 6, 8)  # what mx.quantize takes
KV_GROUP_SIZES = (32, 64, 128)
DEFAULT_KV_GROUP_SIZE = 64  # mlx_lm's
DEFAULT_QUANTIZED_KV_START = 5000  # mlx_lm's: the cache is quantized from this many tokens on
DEFAULT_NUM_DRAFT_TOKENS = 3  # mlx_lm.generate's
MAX_DRAFT_TOKENS = 64


@dataclass(frozen=True)
class RuntimeOptions:
    adapter_path: Path | None = None
    draft_model: str | None = None  # a models.yaml id, a local MLX directory or a Hugging Face repo id
    num_draft_tokens: int = DEFAULT_NUM_DRAFT_TOKENS
    kv_bits: int | None = None
    kv_group_size: int | None = None  # None: mlx_lm's 64, or the largest that divides the head dimension
    quantized_kv_start: int = DEFAULT_QUANTIZED_KV_START
    max_kv_size: int | None = None

    def check(self) -> RuntimeOptions:
        """Usage errors for values mlx_lm would reject later, or combinations it mishandles."""
        if self.kv_bits is not None and self.kv_bits not in KV_BITS:
            raise UsageError(f"--kv-bits must be one of {', '.join(map(str, KV_BITS))}, not {self.kv_bits}")
        if self.kv_group_size is not None and self.kv_group_size not in KV_GROUP_SIZES:
            raise UsageError(f"--kv-group-size must be one of {', '.join(map(str, KV_GROUP_SIZES))}, "
                             f"not {self.kv_group_size}")
        if not 1 <= self.num_draft_tokens <= MAX_DRAFT_TOKENS:
            raise UsageError(f"--num-draft-tokens must be from 1 to {MAX_DRAFT_TOKENS}")
        if self.max_kv_size is not None and self.max_kv_size < 8:
            raise UsageError("--max-kv-size must be at least 8 tokens (mlx_lm keeps the first 4 always)")
        if self.draft_model and self.max_kv_size is not None:
            raise UsageError("--draft-model needs a cache it can rewind: leave out --max-kv-size")
        if self.draft_model and self.kv_bits is not None:
            raise UsageError("--draft-model with --kv-bits: mlx_lm 0.32 quantizes a speculative run's cache in "
                             "copies it does not hand back, so the next turn could not reuse it; use one of them")
        if self.adapter_path is not None and not (self.adapter_path / "adapter_config.json").is_file():
            raise UsageError(f"--adapter-path {self.adapter_path}: no adapter_config.json there (mlx_lm.lora "
                             "writes adapter_config.json and adapters.safetensors)")
        return self

    def generate_kwargs(self) -> dict[str, Any]:
        """What ``stream_generate`` takes for the cache's quantization and the drafting."""
        kwargs: dict[str, Any] = {}
        if self.kv_bits is not None:
            kwargs.update(kv_bits=self.kv_bits, kv_group_size=self.kv_group_size or DEFAULT_KV_GROUP_SIZE,
                          quantized_kv_start=self.quantized_kv_start)
        if self.draft_model:
            kwargs["num_draft_tokens"] = self.num_draft_tokens
        return kwargs


def server_fields(options: RuntimeOptions, model_field: str, default_model: str) -> dict[str, Any]:
    """What mlx_lm.server takes per request (``adapters``, ``draft_model``, ``num_draft_tokens``);
    a usage error for what it only takes when it starts, or not at all."""
    from localchat.registry import resolve

    if options.kv_bits is not None:
        raise UsageError("--kv-bits is set when mlx_lm.server starts, not per request: "
                         "localchat serve -- --kv-bits N (and --kv-group-size, --quantized-kv-start)")
    if options.max_kv_size is not None:
        raise UsageError("--max-kv-size is in-process only: mlx_lm.server has no bounded cache")
    fields: dict[str, Any] = {}
    if options.adapter_path is not None:
        if model_field == default_model:
            raise UsageError("--adapter-path over HTTP needs -m MODEL: mlx_lm.server applies its own "
                             "--adapter-path to the model it started with")
        fields["adapters"] = str(options.adapter_path)
    if options.draft_model:
        fields.update(draft_model=resolve(options.draft_model).location, num_draft_tokens=options.num_draft_tokens)
    return fields


def make_cache(model: Any, max_kv_size: int | None = None) -> list[Any]:
    """The model's own KV cache, or a rotating one of ``max_kv_size`` tokens (keeping the first 4,
    as mlx_lm does). mlx_lm 0.32 drops ``max_kv_size`` for any model that builds its own cache
    (llama does), so the rotating layers are built here from plain ones; a model whose cache is
    something else (sliding windows, state-space layers) cannot be bounded this way."""
    from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

    cache = make_prompt_cache(model)
    if max_kv_size is None:
        return cache
    if not all(type(c) is KVCache for c in cache):
        kinds = ", ".join(sorted({type(c).__name__ for c in cache}))
        raise UsageError(f"--max-kv-size: this model's cache ({kinds}) has no rotating form; leave it out")
    return [RotatingKVCache(max_size=max_kv_size, keep=4) for _ in cache]


def sampler_for(params: GenerationParams):
    """mlx_lm's sampler for these settings (greedy at temperature 0)."""
    from mlx_lm.sample_utils import make_sampler

    return make_sampler(temp=params.temperature or 0.0, top_p=params.top_p or 0.0, min_p=params.min_p or 0.0,
                        top_k=params.top_k or 0)


def logits_processors_for(params: GenerationParams, cached_ids: list[int]) -> list[Any] | None:
    """mlx_lm's repetition penalty, seeing the whole prompt as ``mlx_lm.generate`` does: with KV
    reuse only the new tokens are fed, so the cached ones are put back in front."""
    if params.repetition_penalty in (None, 1.0):
        return None
    import mlx.core as mx
    from mlx_lm.sample_utils import make_logits_processors

    processors = make_logits_processors(repetition_penalty=params.repetition_penalty)
    if not cached_ids:
        return processors
    before = mx.array(cached_ids[-64:])  # more than the penalty's context of 20 tokens

    def with_cached(processor):
        return lambda tokens, logits: processor(
            mx.concatenate([before, tokens]) if tokens is not None else before, logits)

    return [with_cached(p) for p in processors]


def load_model(path: Path, options: RuntimeOptions, name: str) -> tuple[Any, Any]:
    """``mlx_lm.load`` with the adapter, if any; one line for whatever goes wrong."""
    from mlx_lm import load

    try:
        loaded = load(str(path), adapter_path=str(options.adapter_path) if options.adapter_path else None)
        return loaded[0], loaded[1]
    except Exception as exc:  # mlx_lm raises many types for a broken model or a mismatched adapter
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        detail = " ".join(lines[:2]) if lines else type(exc).__name__  # mlx_lm lists the first mismatch next
        what = f"{name} with the adapter {options.adapter_path}" if options.adapter_path else name
        raise LocalchatError(f"cannot load {what} from {path}: {detail}") from None


def fit_kv_group(model: Any, options: RuntimeOptions) -> RuntimeOptions:
    """mx.quantize groups along a head's dimension, so the group size must divide it: a size the
    user set that does not is a usage error; one left unset is mlx_lm's 64 when it fits, else the
    largest that does (the demo's heads have 32 dimensions)."""
    if options.kv_bits is None:
        return options
    args = getattr(model, "args", None)
    heads, hidden = getattr(args, "num_attention_heads", None), getattr(args, "hidden_size", None)
    head_dim = getattr(args, "head_dim", None) or (hidden // heads if heads and hidden else None)
    fits = [g for g in KV_GROUP_SIZES if head_dim and head_dim % g == 0]
    if options.kv_group_size is None:
        chosen = DEFAULT_KV_GROUP_SIZE if DEFAULT_KV_GROUP_SIZE in fits or not fits else fits[-1]
        return replace(options, kv_group_size=chosen)
    if head_dim and head_dim % options.kv_group_size:
        hint = f": use --kv-group-size {fits[-1]}" if fits else ""
        raise UsageError(f"--kv-group-size {options.kv_group_size} does not divide this model's head dimension "
                         f"({head_dim}){hint}")
    return options


def check_draft(model_tokenizer: Any, draft_tokenizer: Any, draft: str) -> None:
    """A draft model must share the model's vocabulary, or its proposals mean other tokens."""
    if draft_tokenizer.vocab_size != model_tokenizer.vocab_size:
        raise UsageError(f"--draft-model {draft} has a vocabulary of {draft_tokenizer.vocab_size} tokens, the "
                         f"model {model_tokenizer.vocab_size}: a draft model must share the model's tokenizer")
