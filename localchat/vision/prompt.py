"""OpenAI-shaped messages with image parts into the prompt mlx-vlm builds, as ``mlx_vlm.server`` does.

The server keeps each image where its user message had it (an ``{"type": "image"}`` marker in
that message) and passes the images themselves beside the prompt, in order; the in-process
backend and the toy's trainer use this same reading, so a model answers alike in both backends.
Needs the ``vision`` extra (imported on use).
"""

from __future__ import annotations

from typing import Any


def image_urls(messages: list[dict[str, Any]]) -> list[str]:
    """Every image's URL in the user messages, in order (what the server collects)."""
    return [part["image_url"]["url"] for m in messages if m.get("role") == "user" and isinstance(m.get("content"), list)
            for part in m["content"] if isinstance(part, dict) and part.get("type") == "image_url"]


def vlm_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as mlx-vlm's chat template takes them: a user message keeps its text and image
    markers in order; every other message keeps its text."""
    from mlx_vlm.prompt_utils import extract_text_from_content, normalize_image_content

    out = []
    for message in messages:
        content = message.get("content") or ""
        if isinstance(content, list):
            content = (normalize_image_content(content) if message["role"] == "user"
                       else extract_text_from_content(content))
        out.append({"role": message["role"], "content": content})
    return out


def vlm_prompt(processor: Any, config: Any, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
    """The prompt text mlx-vlm renders for ``messages`` (image markers in place, images apart)."""
    from mlx_vlm.prompt_utils import apply_chat_template

    return str(apply_chat_template(processor, config, vlm_messages(messages),
                                   add_generation_prompt=add_generation_prompt, num_images=len(image_urls(messages))))
