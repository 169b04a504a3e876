"""Whether pictures can be used here: the ``vision`` extra installed, and a model that sees.

mlx-vlm (with transformers, opencv and datasets) is an optional extra, so every path that takes a
picture asks ``require_extra`` first and gets one line naming the command that adds it. A model is
a vision model when the registry says so (``vision: true``) or its ``config.json`` has a vision
tower (``vision_config``), as every mlx-vlm model's has.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from localchat.errors import UsageError
from localchat.registry import ModelRef, load_registry, read_config


def quiet_transformers() -> None:
    """transformers (under mlx-vlm) warns on stderr about PyTorch's absence and its own deprecations,
    a line each time a processor runs; the chat's stderr is for the chat. Read when transformers
    is first imported, or set on its logger once it is (mlx_lm imports it too); a user's own
    ``TRANSFORMERS_VERBOSITY`` wins."""
    import os
    import sys

    if "TRANSFORMERS_VERBOSITY" in os.environ:
        return
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"
    if "transformers" in sys.modules:
        from transformers.utils import logging

        logging.set_verbosity_error()


def has_extra() -> bool:
    try:
        return importlib.util.find_spec("mlx_vlm") is not None
    except (ImportError, ValueError):
        return False


def require_extra(what: str = "--image") -> None:
    if not has_extra():
        from localchat.extras import install_hint

        raise UsageError(f"{what} needs the vision extra (mlx-vlm), which is not installed: {install_hint('vision')}")


def is_vision(ref: ModelRef) -> bool:
    if ref.entry is not None and ref.entry.vision:
        return True
    return ref.kind in ("bundled", "local") and "vision_config" in read_config(Path(ref.location))


def vision_model_names() -> list[str]:
    """The registry's vision models, the bundled toy first."""
    return [entry.id for entry in load_registry() if entry.vision]


def text_only(model_id: str) -> UsageError:
    """What a text-only model given a picture says: one line, naming models that see."""
    names = vision_model_names()
    suggestion = f" (e.g. -m {names[0]}" + (f", or -m {names[1]} on a Mac" if len(names) > 1 else "") + ")" \
        if names else ""
    return UsageError(f"{model_id} is a text-only model: it cannot see pictures; use a vision model{suggestion}")


def refuse_text_only(ref: ModelRef) -> None:
    """Before the model loads: a model the registry or its directory calls text-only is refused."""
    if not is_vision(ref):
        raise text_only(ref.id)

