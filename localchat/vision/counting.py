"""Tokens as a vision model's own processor makes them: a prompt with its pictures, or one picture.

The in-process backend counts with the processor it generates with; a server's vision model is
counted with the same processor read from the model's directory here (no weights), so ``/image``
shows a picture's cost before it is sent either way.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from localchat.vision.image import bytes_of_data_url, decoded
from localchat.vision.prompt import image_urls, vlm_prompt
from localchat.vision.support import quiet_transformers

PROBE = "data:image/png;base64,"  # stands for the picture being counted


class PictureCounter:
    """A processor and the model's config; pictures decoded once per data URL."""

    def __init__(self, processor: Any, config: Any):
        self.processor = processor
        self.config = config
        self._pictures: dict[str, Any] = {}

    def inputs(self, messages: list[dict[str, Any]]) -> tuple[str, list[Any]]:
        """The prompt mlx-vlm renders and the decoded pictures it goes with."""
        pictures = []
        for url in image_urls(messages):
            if url not in self._pictures:
                self._pictures[url] = decoded(bytes_of_data_url(url))
            pictures.append(self._pictures[url])
        return vlm_prompt(self.processor, self.config, messages), pictures

    def prompt_tokens(self, messages: list[dict[str, Any]]) -> int:
        from mlx_vlm.utils import prepare_inputs

        prompt, pictures = self.inputs(messages)
        return int(prepare_inputs(self.processor, images=pictures or None, prompts=prompt)["input_ids"].size)

    def picture_tokens(self, picture_bytes: bytes) -> int:
        """The tokens one picture adds to a question (the prompt with it, less the prompt without)."""
        alone = [{"role": "user", "content": "?"}]
        shown = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": PROBE}},
                                              {"type": "text", "text": "?"}]}]
        self._pictures[PROBE] = decoded(picture_bytes)
        try:
            return self.prompt_tokens(shown) - self.prompt_tokens(alone)
        finally:
            del self._pictures[PROBE]


def local_picture_tokens(model_dir: Path) -> Callable[[bytes], int | None]:
    """A picture's tokens by the processor in ``model_dir``, loaded on first use (None when it
    cannot be read: the label then shows the size only)."""
    counter: list[PictureCounter] = []

    def count(picture_bytes: bytes) -> int | None:
        try:
            if not counter:
                quiet_transformers()
                from mlx_vlm.utils import load_config, load_image_processor, load_processor

                processor = load_processor(model_dir, add_detokenizer=False)
                if (images := load_image_processor(model_dir)) is not None:  # as mlx_vlm.load does
                    processor.image_processor = images
                counter.append(PictureCounter(processor, load_config(model_dir)))
            return counter[0].picture_tokens(picture_bytes)
        except Exception:  # a processor mlx-vlm cannot read here: the count is unknown, nothing else
            return None

    return count
