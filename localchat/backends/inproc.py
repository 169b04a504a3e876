"""In-process backend: mlx_lm in this process, with the KV cache reused across turns.

The cache is only a prefix cache over the same full prompt the history builder made: each turn
keeps the longest common prefix of the tokens it holds and the new prompt, trims the rest with
mlx_lm's cache helpers and prefills only the new tokens. A thinking model's template usually drops
earlier reasoning from the prompt, so the cached reasoning (and the answer after it) is trimmed
and the answer re-prefilled. A cache that cannot be trimmed (hybrid models' ``ArraysCache``) keeps
a checkpoint at the end of each prompt instead, as mlx_lm.server does, and restarts from it; so
does a rotating cache (``--max-kv-size``) once it has wrapped. With a draft model the cache is the
model's layers then the draft's, each trimmed to the prefix both still hold.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localchat.backends import Event, Finished, GenerationParams, Message, PrefillProgress
from localchat.backends.masking import GrammarSetup
from localchat.backends.mlx_options import (
    RuntimeOptions,
    check_draft,
    fit_kv_group,
    load_model,
    logits_processors_for,
    make_cache,
    sampler_for,
)
from localchat.backends.reply import ReplySplitter, opens_reasoning
from localchat.backends.saved_cache import model_fingerprint
from localchat.errors import LocalchatError
from localchat.grammar.answer_formats import AnswerFormat
from localchat.grammar.think_budget import DRAFT_AND_BUDGET, budgeted
from localchat.registry import ModelRef, context_length, local_dir, resolve
from localchat.templates.render import ChatTemplate, check_tool_support


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
    """mlx_lm's KV cache (the model's layers, then a draft model's) and the token ids it holds."""

    model: Any
    draft_model: Any = None
    max_kv_size: int | None = None
    cache: list[Any] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    checkpoints: bool = True  # for caches that cannot be trimmed
    checkpoint: Checkpoint | None = None
    rebuilt: bool = False  # the last ``reuse`` could not trim and started again

    def reuse(self, prompt_ids: list[int]) -> tuple[int, int]:
        """Keep the shared prefix (at least one prompt token is left to feed the model).

        Returns (cached tokens reused, cached tokens that no longer matched and were dropped).
        """
        from mlx_lm.models.cache import can_trim_prompt_cache

        held, offsets = len(self.ids), self._offsets()
        keep = min(common_prefix_length(self.ids, prompt_ids), len(prompt_ids) - 1, *offsets)
        stale = keep < held or any(offset > keep for offset in offsets)
        self.rebuilt = False
        if not self.cache:
            self._restart([])
        elif stale and can_trim_prompt_cache(self.cache):
            self._trim_to(keep)
            self.ids = self.ids[:keep]
        elif stale:
            self._restart(prompt_ids)
            self.rebuilt = True
        return len(self.ids), held - len(self.ids)

    def _parts(self) -> list[list[Any]]:
        """The model's layers and the draft model's, which may hold a token more or less."""
        split = len(self.model.layers) if self.draft_model is not None else len(self.cache)
        return [part for part in (self.cache[:split], self.cache[split:]) if part]

    def _offsets(self) -> list[int]:
        return [part[0].offset for part in self._parts() if hasattr(part[0], "offset")]

    def _trim_to(self, keep: int) -> None:
        from mlx_lm.models.cache import trim_prompt_cache

        for part in self._parts():
            held = part[0].offset if hasattr(part[0], "offset") else len(self.ids)
            if held > keep:
                trim_prompt_cache(part, held - keep)

    def _restart(self, prompt_ids: list[int]) -> None:
        """From the checkpoint when the new prompt still starts with its tokens; else empty."""
        point = self.checkpoint
        if point and len(point.ids) < len(prompt_ids) and prompt_ids[:len(point.ids)] == point.ids:
            self.cache, self.ids = copy.deepcopy(point.cache), list(point.ids)
        else:
            self.cache, self.ids = self.fresh_layers(), []

    def fresh_layers(self) -> list[Any]:
        cache = make_cache(self.model, self.max_kv_size)
        return cache + make_cache(self.draft_model) if self.draft_model is not None else cache

    def adopt(self, cache: list[Any], ids: list[int]) -> None:
        """Hold a cache made elsewhere (a saved session's), whose layers hold ``ids``."""
        self.cache, self.ids, self.checkpoint = cache, list(ids), None

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
                 checkpoints: bool = True, options: RuntimeOptions | None = None, draft_model: Any = None,
                 fingerprint: str = ""):
        self.model = model
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.template = ChatTemplate(tokenizer, model_id, dict(chat_template_kwargs or {}))
        self.cache_reuse = cache_reuse
        self.checkpoints = checkpoints
        self.options = options or RuntimeOptions()
        self.draft_model = draft_model
        self._cache = self._new_cache()
        self._encoded: tuple[str | None, list[int]] = (None, [])
        self.fingerprint = fingerprint  # of the model's files (a saved cache is only used with the same)
        self.grammar = GrammarSetup(tokenizer, getattr(getattr(model, "args", None), "vocab_size", None))
        self.refused_tools: dict[str, str] = {}  # offered tools the call grammar cannot take, and why

    def _new_cache(self) -> PromptCache:
        return PromptCache(self.model, self.draft_model, self.options.max_kv_size, checkpoints=self.checkpoints)

    @property
    def cached_ids(self) -> list[int]:
        """The token ids the KV cache holds after the last turn (prompt and reply)."""
        return list(self._cache.ids)

    def held_cache(self) -> tuple[list[Any], list[int]]:
        """The KV cache's layers and the ids they hold (for saving; not to be changed)."""
        return self._cache.cache, list(self._cache.ids)

    def fresh_cache_layers(self) -> list[Any]:
        return self._cache.fresh_layers()

    def adopt_cache(self, cache: list[Any], ids: list[int]) -> None:
        self._cache.adopt(cache, ids)

    def encode(self, messages: list[Message], think: bool | None = None) -> list[int]:
        """Token ids of the model's own chat template, with the assistant turn opened (a
        ``TemplateError`` when the template refuses them). The last prompt's ids are kept: a turn
        counts its tokens (context check) and then sends them."""
        key = json.dumps([messages, think, self.template.tools], ensure_ascii=False, default=str)
        if self._encoded[0] != key:
            self._encoded = (key, self.template.ids(messages, think))
        return list(self._encoded[1])

    def context_length(self) -> int | None:
        """From the model's config (``max_position_embeddings`` and kin)."""
        args = getattr(self.model, "args", None)
        return context_length(vars(args)) if hasattr(args, "__dict__") else None

    def count_tokens(self, messages: list[Message], think: bool | None = None) -> int:
        return len(self.encode(messages, think))

    def offer_tools(self, tools: list[dict[str, Any]]) -> None:
        """Render these tools into every prompt; a template that cannot take them, or whose calls
        no parser reads, is refused in one line. Where calls are decoded under a grammar, a tool
        whose schema it cannot take is left out (``refused_tools`` says which and why), never the others."""
        from localchat.grammar.compile import byte_tokenizer, refused_tools

        check_tool_support(self.template, self.model_id)
        masked = self.grammar.masks_calls and self.grammar.call_markers(self.template.traits) is not None
        self.refused_tools = refused_tools(tools, byte_tokenizer()) if masked and tools else {}
        self.template.tools = [t for t in tools if t["function"]["name"] not in self.refused_tools]

    def prepare_answer(self, fmt: AnswerFormat | None) -> None:
        """Check now, before any call, that the format can be enforced for this model, and read the
        tokenizer the mask needs (a format, or tool calls) outside any turn's clock."""
        if fmt is not None:
            self.grammar.check(fmt)
        _ = self.grammar.llg

    def stream(self, messages: list[Message], params: GenerationParams) -> Iterator[Event]:
        import mlx.core as mx
        from mlx_lm import stream_generate

        if params.think_budget is not None and self.draft_model is not None:
            raise LocalchatError(DRAFT_AND_BUDGET)
        prompt_ids = self.encode(messages, params.think)
        if not self.cache_reuse:
            self._cache = self._new_cache()
        cached, missed = self._cache.reuse(prompt_ids)
        yield PrefillProgress(cached, len(prompt_ids))  # what is left to prefill, for a spinner to say
        if params.seed is not None:
            mx.random.seed(params.seed)
        mx.reset_peak_memory()
        traits = self.template.traits
        splitter = ReplySplitter.for_prompt(
            traits.reasoning, self.tokenizer, prompt_ids, tool_format=traits.tool_format, tools=self.template.tools
        )
        masking = self.grammar.for_reply(params.answer, self.template.tools, traits, prompt_ids,
                                         offset=1 if self.draft_model is not None else len(prompt_ids) - cached,
                                         drafting=self.draft_model is not None)
        budget = budgeted(params.think_budget, traits.reasoning, self.tokenizer,
                          opens_reasoning(self.tokenizer, prompt_ids, traits.reasoning))
        processors = [*(logits_processors_for(params, prompt_ids[:cached]) or []), *([masking] if masking else []),
                      *([budget] if budget else [])]
        sampler = masking.sampler(sampler_for(params)) if masking else sampler_for(params)
        generated: list[int] = []
        drafted = 0
        last = None
        try:
            for last in stream_generate(self.model, self.tokenizer, prompt_ids[cached:],
                                        max_tokens=params.max_tokens, sampler=sampler,
                                        logits_processors=processors or None,
                                        prompt_cache=self._cache.cache, draft_model=self.draft_model,
                                        prompt_progress_callback=self._cache.on_prefill(prompt_ids, cached),
                                        **self.options.generate_kwargs()):
                generated.append(last.token)
                drafted += bool(last.from_draft)
                yield from splitter.feed(last.text, last.token)
        except (RuntimeError, ValueError, MemoryError) as exc:  # MLX failures, e.g. out of memory
            raise LocalchatError(f"generation failed: {type(exc).__name__}: {exc}".splitlines()[0]) from None
        finally:
            self._cache.record(prompt_ids + generated)
        if last is None:
            raise LocalchatError("generation failed: mlx_lm's stream ended before its first token")
        finish_reason = last.finish_reason or "length"
        yield from splitter.finish(finish_reason)
        if splitter.calls and finish_reason == "stop":
            finish_reason = "tool_calls"  # as mlx_lm.server says it
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
            draft_tokens=drafted if self.draft_model is not None else None,
            cache_rebuilt=self._cache.rebuilt,
            mask_s=masking.mask_s if masking else 0.0,
            masked_tokens=masking.masked if masking else 0,
            reasoning_cut=bool(budget and budget.cut),
        )

    def close(self) -> None:
        self._cache = self._new_cache()


def load_inproc(ref: ModelRef, path: Path, *, cache_reuse: bool = True,
                options: RuntimeOptions | None = None) -> InProcessBackend:
    """Load a model directory with ``mlx_lm.load`` (``path`` from ``registry.local_dir``), with its
    adapter and draft model when the options name them."""
    options = (options or RuntimeOptions()).check()
    model, tokenizer = load_model(path, options, ref.id)
    options = fit_kv_group(model, options)
    make_cache(model, options.max_kv_size)  # a model whose cache cannot be bounded is refused now
    draft = draft_path = None
    if options.draft_model:
        draft_ref = resolve(options.draft_model)
        draft_path = local_dir(draft_ref)
        draft, draft_tokenizer = load_model(draft_path, RuntimeOptions(), draft_ref.id)
        check_draft(tokenizer, draft_tokenizer, draft_ref.id)
    return InProcessBackend(model, tokenizer, ref.id, chat_template_kwargs=ref.chat_template_kwargs,
                            cache_reuse=cache_reuse, options=options, draft_model=draft,
                            fingerprint=model_fingerprint(path, options.adapter_path, draft_path))
