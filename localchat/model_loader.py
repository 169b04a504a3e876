"""Loading a model in this process: mlx-vlm for a vision model, mlx_lm for any other."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from localchat.backends.mlx_options import RuntimeOptions
from localchat.errors import UsageError
from localchat.registry import ModelRef
from localchat.vision.support import is_vision, require_extra

if TYPE_CHECKING:
    from localchat.backends.inproc import InProcessBackend
    from localchat.vision.backend import VisionBackend


def load_inproc_or_vision(ref: ModelRef, path: Path, *, cache_reuse: bool, options: RuntimeOptions
                          ) -> InProcessBackend | VisionBackend:
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

    return load_vision(ref, path, cache_reuse=cache_reuse, options=options)
