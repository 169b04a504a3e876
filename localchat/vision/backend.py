"""In-process backend for vision models: mlx-vlm's own loading, processor and generation.

The history builder's messages (OpenAI content parts, pictures as data URLs) become the prompt
and the pictures mlx-vlm's server would make of them (``vision.prompt``); the reply streams as the
same typed events as mlx_lm's, sampled by mlx_lm's own sampler. The KV cache is mlx-vlm's
``PromptCacheState``: a turn whose new part is text only reuses the cached prefix, pictures of
earlier turns included; a turn that brings a new picture is prefilled whole (mlx-vlm never reuses
a prefix whose suffix holds a picture). Either way ``Finished.cached_tokens`` says what was reused.
mlx-vlm matches the cached prefix by token ids alone, and every picture of a size is the same run of
``<image>`` tokens: a new conversation with another picture of that size would reuse the old
picture's keys and values and describe the old picture. So the cache is kept only while the prompt's
pictures are the very ones it was built with, and started afresh otherwise.
TTFT includes encoding the pictures: mlx-vlm encodes them inside its prefill.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from localchat.backends import Event, Finished, GenerationParams, Message, PrefillProgress, TextChunk
from localchat.backends.mlx_options import RuntimeOptions, logits_processors_for, sampler_for
from localchat.errors import LocalchatError, UsageError
from localchat.registry import ModelRef, context_length
from localchat.vision.counting import PictureCounter
from localchat.vision.prompt import image_urls
from localchat.vision.support import quiet_transformers


class VisionBackend:
    """Generates with ``mlx_vlm.stream_generate``; counts tokens with the model's own processor."""

    name = "inproc"
    template = None  # mlx-vlm renders the chat template itself
    timing_note = ("TTFT includes encoding the pictures: mlx-vlm encodes them in its prefill; a turn that brings a "
                   "new picture is prefilled whole, one with text only reuses the cached prefix, pictures and all")

    def __init__(self, model: Any, processor: Any, model_id: str, *, cache_reuse: bool = True,
                 options: RuntimeOptions | None = None):
        self.model = model
        self.options = options or RuntimeOptions()  # as given: none of mlx_lm's load-time options applies
        self.processor = processor
        self.model_id = model_id
        self.cache_reuse = cache_reuse
        self._state = self._new_state()
        self._shown: tuple[str, ...] = ()  # the pictures of the prompt the cache holds
        self.counter = PictureCounter(processor, model.config)

    @property
    def tokenizer(self) -> Any:
        return self.processor.tokenizer

    @staticmethod
    def _new_state() -> Any:
        from mlx_vlm.generate.common import PromptCacheState

        return PromptCacheState()

    def count_tokens(self, messages: list[Message], think: bool | None = None) -> int:
        """The prompt's tokens as the processor makes them, every picture's tokens included."""
        return self.counter.prompt_tokens(messages)

    def image_tokens(self, picture_bytes: bytes) -> int:
        """How many tokens the processor gives this picture."""
        return self.counter.picture_tokens(picture_bytes)

    def context_length(self) -> int | None:
        config = getattr(self.model, "config", None)
        text = getattr(config, "text_config", None)
        return context_length(vars(text)) if hasattr(text, "__dict__") else None

    def offer_tools(self, tools: list[dict[str, Any]]) -> None:
        raise UsageError(f"{self.model_id} is a vision model run by mlx-vlm: tools are offered to text models only")

    def prepare_answer(self, fmt: Any) -> None:
        if fmt is not None:
            raise UsageError(f"{self.model_id} is a vision model run by mlx-vlm: --json, --json-schema, --regex "
                             "and --choice are enforced for text models only")

    def stream(self, messages: list[Message], params: GenerationParams) -> Iterator[Event]:
        import mlx.core as mx
        from mlx_vlm import stream_generate

        prompt, pictures = self.counter.inputs(messages)
        shown = tuple(image_urls(messages))
        if not self.cache_reuse or shown != self._shown:
            self._state = self._new_state()  # a cached prefix is only ever one with the same pictures (above)
        self._shown = shown
        yield PrefillProgress(0, 0)
        if params.seed is not None:
            mx.random.seed(params.seed)
        mx.reset_peak_memory()
        last = None
        try:
            for last in stream_generate(self.model, self.processor, prompt, image=pictures or None,
                                        max_tokens=params.max_tokens, sampler=sampler_for(params),
                                        logits_processors=logits_processors_for(params, []),
                                        prompt_cache_state=self._state):
                if last.text:
                    yield TextChunk(last.text)
        except (RuntimeError, ValueError, MemoryError) as exc:
            self._state = self._new_state()  # a failed prefill may leave the cache half written
            raise LocalchatError(f"generation failed: {type(exc).__name__}: {exc}".splitlines()[0]) from None
        if last is None:
            raise LocalchatError("generation failed: mlx-vlm produced nothing")
        yield Finished(finish_reason=last.finish_reason or "length", prompt_tokens=last.prompt_tokens,
                       completion_tokens=last.generation_tokens, cached_tokens=last.cached_tokens,
                       peak_memory_gb=last.peak_memory,
                       runtime={"mlx_vlm_prompt_tps": last.prompt_tps, "mlx_vlm_generation_tps": last.generation_tps})

    def close(self) -> None:
        self._state = self._new_state()


def load_vision(ref: ModelRef, path: Path, *, cache_reuse: bool = True,
                options: RuntimeOptions | None = None) -> VisionBackend:
    """``mlx_vlm.load`` of a model directory; one line for whatever goes wrong."""
    quiet_transformers()
    from mlx_vlm import load

    try:
        model, processor = load(str(path))
    except Exception as exc:  # mlx-vlm raises many types for a broken model
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        raise LocalchatError(f"cannot load {ref.id} from {path} with mlx-vlm: "
                             f"{lines[0] if lines else type(exc).__name__}") from None
    return VisionBackend(model, processor, ref.id, cache_reuse=cache_reuse, options=options)
