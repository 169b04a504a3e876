"""In-process backend: mlx_lm in this process, with the KV cache reused across turns.

The cache is only a prefix cache over the same full prompt the history builder made: each turn
keeps the longest common prefix of the tokens it holds and the new prompt, trims the rest with
mlx_lm's cache helpers and prefills only the new tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localchat.backends import (
    Event,
    Finished,
    GenerationParams,
    Message,
    TextChunk,
    chat_template_ids,
)
from localchat.errors import LocalchatError
from localchat.registry import ModelRef, context_length


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class PromptCache:
    """mlx_lm's KV cache together with the token ids it holds."""

    model: Any
    cache: list[Any] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)

    def reuse(self, prompt_ids: list[int]) -> tuple[int, int]:
        """Keep the shared prefix (at least one prompt token is left to feed the model).

        Returns (cached tokens reused, cached tokens that no longer matched and were dropped).
        """
        from mlx_lm.models.cache import (
            can_trim_prompt_cache,
            make_prompt_cache,
            trim_prompt_cache,
        )

        keep = min(common_prefix_length(self.ids, prompt_ids), len(prompt_ids) - 1)
        missed = len(self.ids) - keep
        if not self.cache or (missed and not can_trim_prompt_cache(self.cache)):
            self.cache, self.ids, keep = make_prompt_cache(self.model), [], 0
        elif missed:
            trim_prompt_cache(self.cache, missed)
            self.ids = self.ids[:keep]
        return keep, missed

    def record(self, ids: list[int]) -> None:
        """Remember which tokens the cache now holds (it may hold fewer than were generated)."""
        held = self.cache[0].offset if self.cache and hasattr(self.cache[0], "offset") else len(ids)
        self.ids = ids[:held]


class InProcessBackend:
    """Generates with ``mlx_lm.stream_generate`` and mlx_lm's own sampler."""

    name = "inproc"

    def __init__(self, model: Any, tokenizer: Any, model_id: str, *,
                 chat_template_kwargs: dict[str, Any] | None = None, cache_reuse: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.cache_reuse = cache_reuse
        self._cache = PromptCache(model)
        self._encoded: tuple[str | None, list[int]] = (None, [])

    @property
    def cached_ids(self) -> list[int]:
        """The token ids the KV cache holds after the last turn (prompt and reply)."""
        return list(self._cache.ids)

    def encode(self, messages: list[Message]) -> list[int]:
        """Token ids of the model's own chat template, with the assistant turn opened. The last
        prompt's ids are kept: a turn counts its tokens (context check) and then sends them."""
        key = json.dumps(messages, ensure_ascii=False)
        if self._encoded[0] != key:
            self._encoded = (key, chat_template_ids(self.tokenizer, messages, self.chat_template_kwargs))
        return list(self._encoded[1])

    def context_length(self) -> int | None:
        """From the model's config (``max_position_embeddings`` and kin)."""
        args = getattr(self.model, "args", None)
        return context_length(vars(args)) if hasattr(args, "__dict__") else None

    def _encode_or_explain(self, messages: list[Message]) -> list[int]:
        from jinja2 import TemplateError

        try:
            return self.encode(messages)
        except TemplateError as exc:  # e.g. a template that refuses a system message
            raise LocalchatError(f"{self.model_id}'s chat template rejected these messages: {exc}") from None

    def count_tokens(self, messages: list[Message]) -> int:
        return len(self.encode(messages))

    def stream(self, messages: list[Message], params: GenerationParams) -> Iterator[Event]:
        import mlx.core as mx
        from mlx_lm import stream_generate
        from mlx_lm.sample_utils import make_sampler

        prompt_ids = self._encode_or_explain(messages)
        if not self.cache_reuse:
            self._cache = PromptCache(self.model)
        cached, missed = self._cache.reuse(prompt_ids)
        if params.seed is not None:
            mx.random.seed(params.seed)
        mx.reset_peak_memory()
        sampler = make_sampler(temp=params.temperature, top_p=params.top_p)
        generated: list[int] = []
        last = None
        try:
            for last in stream_generate(self.model, self.tokenizer, prompt_ids[cached:],
                                        max_tokens=params.max_tokens, sampler=sampler,
                                        prompt_cache=self._cache.cache):
                generated.append(last.token)
                yield TextChunk(last.text)
        except (RuntimeError, ValueError, MemoryError) as exc:  # MLX failures, e.g. out of memory
            raise LocalchatError(f"generation failed: {type(exc).__name__}: {exc}".splitlines()[0]) from None
        finally:
            self._cache.record(prompt_ids + generated)
        yield Finished(
            finish_reason=last.finish_reason or "length",
            prompt_tokens=len(prompt_ids),
            completion_tokens=last.generation_tokens,
            cached_tokens=cached,
            cache_miss_tokens=missed,
            peak_memory_gb=last.peak_memory,
            runtime={"mlx_lm_prompt_tps": last.prompt_tps,
                     "mlx_lm_generation_tps": last.generation_tps},
        )

    def close(self) -> None:
        self._cache = PromptCache(self.model)


def load_inproc(ref: ModelRef, path: Path, *, cache_reuse: bool = True) -> InProcessBackend:
    """Load a model directory with ``mlx_lm.load``; ``path`` comes from ``registry.local_dir``."""
    from mlx_lm import load

    try:
        model, tokenizer = load(str(path))
    except Exception as exc:  # mlx_lm raises many types for a broken or unsupported model
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise LocalchatError(f"cannot load {ref.id} from {path}: {detail}") from None
    return InProcessBackend(model, tokenizer, ref.id, chat_template_kwargs=ref.chat_template_kwargs,
                            cache_reuse=cache_reuse)
