"""In-process backend: mlx_lm in this process, with the KV cache reused across turns.

The cache is only a prefix cache over the same full prompt the history builder made: each turn
keeps the longest common prefix of the tokens it holds and the new prompt, trims the rest with
mlx_lm's cache helpers and prefills only the new tokens. A thinking model's template usually drops
earlier reasoning from the prompt, so the cached reasoning (and the answer after it) is trimmed
and the answer re-prefilled. A cache that cannot be trimmed (hybrid models' ``ArraysCache``) keeps
a checkpoint at the end of each prompt instead, as mlx_lm.server does, and restarts from it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localchat.backends import Event, Finished, GenerationParams, Message
from localchat.backends.reasoning import ReasoningSplitter
from localchat.errors import LocalchatError
from localchat.registry import ModelRef, context_length
from localchat.templates.render import ChatTemplate


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class Checkpoint:
    """A copy of the cache as it stood at the end of a prompt (less its last token)."""

    cache: list[Any]
    ids: list[int]


@dataclass
class PromptCache:
    """mlx_lm's KV cache together with the token ids it holds."""

    model: Any
    cache: list[Any] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    checkpoints: bool = True  # for caches that cannot be trimmed
    checkpoint: Checkpoint | None = None

    def reuse(self, prompt_ids: list[int]) -> tuple[int, int]:
        """Keep the shared prefix (at least one prompt token is left to feed the model).

        Returns (cached tokens reused, cached tokens that no longer matched and were dropped).
        """
        from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

        held = len(self.ids)
        keep = min(common_prefix_length(self.ids, prompt_ids), len(prompt_ids) - 1)
        if not self.cache:
            self._restart([])
        elif keep < held and can_trim_prompt_cache(self.cache):
            trim_prompt_cache(self.cache, held - keep)
            self.ids = self.ids[:keep]
        elif keep < held:
            self._restart(prompt_ids)
        return len(self.ids), held - len(self.ids)

    def _restart(self, prompt_ids: list[int]) -> None:
        """From the checkpoint when the new prompt still starts with its tokens; else empty."""
        from mlx_lm.models.cache import make_prompt_cache

        point = self.checkpoint
        if point and len(point.ids) < len(prompt_ids) and prompt_ids[:len(point.ids)] == point.ids:
            self.cache, self.ids = copy.deepcopy(point.cache), list(point.ids)
        else:
            self.cache, self.ids = make_prompt_cache(self.model), []

    def on_prefill(self, prompt_ids: list[int], cached: int) -> Callable[[int, int], None]:
        """A ``prompt_progress_callback`` that keeps a checkpoint once the prompt, less the token
        that starts generation, is in a cache that cannot be trimmed."""
        from mlx_lm.models.cache import can_trim_prompt_cache

        def progress(done: int, total: int) -> None:
            if self.checkpoints and total > 1 and done == total - 1 and not can_trim_prompt_cache(self.cache):
                self.checkpoint = Checkpoint(copy.deepcopy(self.cache), prompt_ids[:cached + done])

        return progress

    def record(self, ids: list[int]) -> None:
        """Remember which tokens the cache now holds (it may hold fewer than were generated)."""
        held = next((c.offset for c in self.cache if hasattr(c, "offset")), len(ids))
        self.ids = ids[:held]


class InProcessBackend:
    """Generates with ``mlx_lm.stream_generate`` and mlx_lm's own sampler."""

    name = "inproc"

    def __init__(self, model: Any, tokenizer: Any, model_id: str, *,
                 chat_template_kwargs: dict[str, Any] | None = None, cache_reuse: bool = True,
                 checkpoints: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.template = ChatTemplate(tokenizer, model_id, dict(chat_template_kwargs or {}))
        self.cache_reuse = cache_reuse
        self.checkpoints = checkpoints
        self._cache = PromptCache(model, checkpoints=checkpoints)
        self._encoded: tuple[str | None, list[int]] = (None, [])

    @property
    def cached_ids(self) -> list[int]:
        """The token ids the KV cache holds after the last turn (prompt and reply)."""
        return list(self._cache.ids)

    def encode(self, messages: list[Message], think: bool | None = None) -> list[int]:
        """Token ids of the model's own chat template, with the assistant turn opened (a
        ``TemplateError`` when the template refuses them). The last prompt's ids are kept: a turn
        counts its tokens (context check) and then sends them."""
        key = json.dumps([messages, think], ensure_ascii=False, default=str)
        if self._encoded[0] != key:
            self._encoded = (key, self.template.ids(messages, think))
        return list(self._encoded[1])

    def context_length(self) -> int | None:
        """From the model's config (``max_position_embeddings`` and kin)."""
        args = getattr(self.model, "args", None)
        return context_length(vars(args)) if hasattr(args, "__dict__") else None

    def count_tokens(self, messages: list[Message], think: bool | None = None) -> int:
        return len(self.encode(messages, think))

    def stream(self, messages: list[Message], params: GenerationParams) -> Iterator[Event]:
        import mlx.core as mx
        from mlx_lm import stream_generate
        from mlx_lm.sample_utils import make_sampler

        prompt_ids = self.encode(messages, params.think)
        if not self.cache_reuse:
            self._cache = PromptCache(self.model, checkpoints=self.checkpoints)
        cached, missed = self._cache.reuse(prompt_ids)
        if params.seed is not None:
            mx.random.seed(params.seed)
        mx.reset_peak_memory()
        sampler = make_sampler(temp=params.temperature, top_p=params.top_p)
        splitter = ReasoningSplitter.for_prompt(self.template.traits.reasoning, self.tokenizer, prompt_ids)
        generated: list[int] = []
        last = None
        try:
            for last in stream_generate(self.model, self.tokenizer, prompt_ids[cached:],
                                        max_tokens=params.max_tokens, sampler=sampler,
                                        prompt_cache=self._cache.cache,
                                        prompt_progress_callback=self._cache.on_prefill(prompt_ids, cached)):
                generated.append(last.token)
                yield from splitter.feed(last.text, last.token)
        except (RuntimeError, ValueError, MemoryError) as exc:  # MLX failures, e.g. out of memory
            raise LocalchatError(f"generation failed: {type(exc).__name__}: {exc}".splitlines()[0]) from None
        finally:
            self._cache.record(prompt_ids + generated)
        finish_reason = last.finish_reason or "length"
        yield from splitter.finish(finish_reason)
        yield Finished(
            finish_reason=finish_reason,
            prompt_tokens=len(prompt_ids),
            completion_tokens=last.generation_tokens,
            cached_tokens=cached,
            cache_miss_tokens=missed,
            reasoning_tokens=splitter.reasoning_tokens,
            peak_memory_gb=last.peak_memory,
            runtime={"mlx_lm_prompt_tps": last.prompt_tps,
                     "mlx_lm_generation_tps": last.generation_tps},
        )

    def close(self) -> None:
        self._cache = PromptCache(self.model, checkpoints=self.checkpoints)


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
