"""In-process backend for vision models: mlx-vlm's own loading, processor and generation.

The history builder's messages (OpenAI content parts, pictures as data URLs) become the prompt
and the pictures mlx-vlm's server would make of them (``vision.prompt``); the reply streams as the
same typed events as mlx_lm's, sampled by mlx_lm's own sampler. The KV cache is mlx-vlm's
``PromptCacheState``: a turn whose new part is text only reuses the cached prefix, pictures of
earlier turns included; a turn that brings a new picture is prefilled whole (mlx-vlm never reuses
a prefix whose suffix holds a picture). Either way ``Finished.cached_tokens`` says what was reused.
TTFT includes encoding the pictures: mlx-vlm encodes them inside its prefill.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from localchat.backends import Event, Finished, GenerationParams, Message, Progress, TextChunk
from localchat.backends.mlx_options import logits_processors_for, sampler_for
from localchat.errors import LocalchatError, UsageError
from localchat.registry import ModelRef, context_length
from localchat.vision.image import bytes_of_data_url, decoded
from localchat.vision.prompt import image_urls, vlm_prompt


class VisionBackend:
    """Generates with ``mlx_vlm.stream_generate``; counts tokens with the model's own processor."""

    name = "inproc"
    template = None  # mlx-vlm renders the chat template itself
    timing_note = ("TTFT includes encoding the pictures: mlx-vlm encodes them in its prefill; a turn that brings a "
                   "new picture is prefilled whole, one with text only reuses the cached prefix, pictures and all")

    def __init__(self, model: Any, processor: Any, model_id: str, *, cache_reuse: bool = True):
        self.model = model
        self.processor = processor
        self.model_id = model_id
        self.cache_reuse = cache_reuse
        self._state = self._new_state()
        self._pictures: dict[str, Any] = {}  # data URL → decoded picture, for the session's life

    @property
    def tokenizer(self) -> Any:
        return self.processor.tokenizer

    @staticmethod
    def _new_state() -> Any:
        from mlx_vlm.generate.common import PromptCacheState

        return PromptCacheState()

    def _inputs(self, messages: list[Message]) -> tuple[str, list[Any]]:
        prompt = vlm_prompt(self.processor, self.model.config, messages)
        pictures = []
        for url in image_urls(messages):
            if url not in self._pictures:
                self._pictures[url] = decoded(bytes_of_data_url(url))
            pictures.append(self._pictures[url])
        return prompt, pictures

    def count_tokens(self, messages: list[Message], think: bool | None = None) -> int:
        """The prompt's tokens as the processor makes them, every picture's tokens included."""
        from mlx_vlm.utils import prepare_inputs

        prompt, pictures = self._inputs(messages)
        inputs = prepare_inputs(self.processor, images=pictures or None, prompts=prompt)
        return int(inputs["input_ids"].size)

    def image_tokens(self, picture_bytes: bytes) -> int:
        """How many tokens the processor gives this picture (its prompt with and without it)."""
        url = "data:image/png;base64,"
        text = [{"role": "user", "content": "?"}]
        with_picture = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                     {"type": "text", "text": "?"}]}]
        self._pictures[url] = decoded(picture_bytes)
        try:
            return self.count_tokens(with_picture) - self.count_tokens(text)
        finally:
            del self._pictures[url]

    def context_length(self) -> int | None:
        config = getattr(self.model, "config", None)
        text = getattr(config, "text_config", None)
        return context_length(vars(text)) if hasattr(text, "__dict__") else None

    def offer_tools(self, tools: list[dict[str, Any]]) -> None:
        raise UsageError(f"{self.model_id} is a vision model run by mlx-vlm: tools are offered to text models only")

    def prepare_answer(self, fmt: Any) -> None:
        if fmt is not None:
            raise UsageError(f"{self.model_id} is a vision model run by mlx-vlm: --format / --json-schema are "
                             "enforced for text models only")

    def stream(self, messages: list[Message], params: GenerationParams) -> Iterator[Event]:
        import mlx.core as mx
        from mlx_vlm import stream_generate

        prompt, pictures = self._inputs(messages)
        if not self.cache_reuse:
            self._state = self._new_state()
        yield Progress(0, 0)
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


def load_vision(ref: ModelRef, path: Path, *, cache_reuse: bool = True) -> VisionBackend:
    """``mlx_vlm.load`` of a model directory; one line for whatever goes wrong."""
    from mlx_vlm import load

    try:
        model, processor = load(str(path))
    except Exception as exc:  # mlx-vlm raises many types for a broken model
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        raise LocalchatError(f"cannot load {ref.id} from {path} with mlx-vlm: "
                             f"{lines[0] if lines else type(exc).__name__}") from None
    return VisionBackend(model, processor, ref.id, cache_reuse=cache_reuse)
