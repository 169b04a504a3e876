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

EXTRA_COMMAND = "uv run --extra vision localchat chat …"


def has_extra() -> bool:
    try:
        return importlib.util.find_spec("mlx_vlm") is not None
    except (ImportError, ValueError):
        return False


def require_extra(what: str = "--image") -> None:
    if not has_extra():
        raise UsageError(f"{what} needs the vision extra (mlx-vlm), which is not installed: run {EXTRA_COMMAND} "
                         "(or pip install 'localchat[vision]')")


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


def load_inproc_or_vision(ref: ModelRef, path: Path, *, cache_reuse: bool, options) -> object:
    """mlx-vlm for a vision model (the extra required), mlx_lm for any other."""
    if not is_vision(ref):
        from localchat.backends.inproc import load_inproc

        return load_inproc(ref, path, cache_reuse=cache_reuse, options=options)
    require_extra(f"-m {ref.id} (a vision model)")
    flags = (("--adapter-path", options.adapter_path), ("--draft-model", options.draft_model),
             ("--kv-bits", options.kv_bits), ("--max-kv-size", options.max_kv_size))
    unsupported = [flag for flag, value in flags if value is not None]
    if unsupported:
        raise UsageError(f"{unsupported[0]} is mlx_lm's: {ref.id} is a vision model, run by mlx-vlm without it")
    from localchat.vision.backend import load_vision

    backend = load_vision(ref, path, cache_reuse=cache_reuse)
    backend.options = options
    return backend
