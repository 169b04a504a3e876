"""An in-process KV cache written beside a saved session, and read back only when it still fits.

mlx_lm's ``save_prompt_cache``/``load_prompt_cache`` do the writing and reading. The file's
metadata says what the cache depends on: the model (id and a fingerprint of its files, adapter and
draft model included), the chat template and its arguments, the cache options, the mlx and mlx_lm
versions, the conversation it belongs to, and the token ids it holds, with a CRC-32 of the
tensors. Anything that differs, or a file that does not read back whole, is one line saying why,
and the turn re-prefills; a cache that is used is only ever a prefix cache, trimmed on the first
turn like any other (``PromptCache.reuse``), so it cannot change an answer.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localchat import bounded_json
from localchat.errors import LocalchatError
from localchat.registry import MODEL_FILE_SUFFIXES

FORMAT = "localchat-kv-1"
SAMPLE_BYTES = 64 * 1024  # of each file's head and tail: catches a re-quantized or replaced file
REASONS = {
    "format": "it was written by another localchat version",
    "session": "it belongs to another conversation once saved under this name",
    "model": "it was made with another model",
    "fingerprint": "the model's files changed since it was saved",
    "template": "the chat template or its arguments changed since it was saved",
    "options": "the KV cache options differ (--kv-bits, --kv-group-size, --quantized-kv-start, --max-kv-size, "
               "--draft-model, --adapter-path)",
    "mlx": "it was made by another mlx version",
    "mlx_lm": "it was made by another mlx_lm version",
}


class CacheUnusable(LocalchatError):
    """Why a saved cache was not used (the turn re-prefills; nothing else is affected)."""


@dataclass(frozen=True)
class Restored:
    cache: list[Any]
    ids: list[int]
    seconds: float


def model_fingerprint(*directories: Path | None) -> str:
    """A hash of the model's files: name, size, and the first and last 64 KB of each (a full
    hash of many GB would cost more than the prefill it saves)."""
    digest = hashlib.sha256()
    for directory in filter(None, directories):
        for file in sorted(p for p in Path(directory).iterdir() if p.suffix in MODEL_FILE_SUFFIXES and p.is_file()):
            size = file.stat().st_size
            digest.update(f"{file.name}\0{size}\0".encode())
            with open(file, "rb") as f:
                digest.update(f.read(SAMPLE_BYTES))
                f.seek(max(SAMPLE_BYTES, size - SAMPLE_BYTES))
                digest.update(f.read(SAMPLE_BYTES))
    return digest.hexdigest()[:32]


def cache_key(backend: Any, session_uid: str) -> dict[str, str]:
    """What a saved cache depends on, as text (safetensors metadata is text)."""
    import mlx.core as mx
    import mlx_lm

    template = backend.template
    source = getattr(backend.tokenizer, "chat_template", None) or ""
    options = backend.options
    quantization = {"kv_bits": options.kv_bits, "kv_group_size": options.kv_group_size,
                    "quantized_kv_start": options.quantized_kv_start} if options.kv_bits else {}
    return {
        "format": FORMAT,
        "session": session_uid,
        "model": backend.model_id,
        "fingerprint": backend.fingerprint,
        "template": hashlib.sha256(json.dumps([source, template.defaults], sort_keys=True, default=str)
                                   .encode()).hexdigest()[:32],
        "options": json.dumps({"max_kv_size": options.max_kv_size, "draft_model": options.draft_model,
                               "adapter_path": str(options.adapter_path) if options.adapter_path else None,
                               **quantization}, sort_keys=True),
        "mlx": getattr(mx, "__version__", "?"),
        "mlx_lm": mlx_lm.__version__,
    }


def checksum(cache: list[Any]) -> str:
    """CRC-32 of every tensor of the cache's state, in order, as raw bytes."""
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten

    crc = 0
    for item in tree_flatten([c.state for c in cache]):
        array = item[1]
        if isinstance(array, mx.array):
            contiguous: Any = np.ascontiguousarray(np.asarray(array.view(mx.uint8)))  # (a buffer: no copy)
            crc = zlib.crc32(contiguous, crc)
    return f"{crc:08x}"


def save(backend: Any, session_uid: str, temp: Path, final: Path) -> int:
    """Write the backend's KV cache to ``final`` (through ``temp``, renamed once whole, mode 0600);
    its size in bytes."""
    from mlx_lm.models.cache import save_prompt_cache

    cache, ids = backend.held_cache()
    cache = _only_what_is_held(cache)
    metadata = {**cache_key(backend, session_uid), "ids": json.dumps(ids), "crc32": checksum(cache),
                "layers": str(len(cache))}
    try:
        save_prompt_cache(str(temp), cache, metadata)
        os.chmod(temp, 0o600)
        os.replace(temp, final)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return final.stat().st_size


def _only_what_is_held(cache: list[Any]) -> list[Any]:
    """mlx_lm 0.32's ``KVCache.state`` is its whole buffer, grown 256 tokens at a time and holding
    trimmed tokens past its offset: save views of what it holds instead."""
    from mlx_lm.models.cache import KVCache

    saved = []
    for layer in cache:
        if type(layer) is KVCache and layer.keys is not None and layer.offset < layer.keys.shape[2]:
            view = KVCache()
            view.keys, view.values = layer.keys[..., :layer.offset, :], layer.values[..., :layer.offset, :]
            view.offset = layer.offset
            layer = view
        saved.append(layer)
    return saved


def load(backend: Any, session_uid: str, path: Path, metadata: dict[str, str]) -> Restored:
    """The cache in ``path`` when its ``metadata`` (read beforehand, without mlx) fits this backend
    and its tensors read back whole; else ``CacheUnusable``."""
    from mlx_lm.models.cache import load_prompt_cache

    expected = cache_key(backend, session_uid)
    for field, value in expected.items():
        if metadata.get(field) != value:
            raise CacheUnusable(REASONS[field])
    ids = _held_ids(metadata.get("ids", ""))
    started = time.perf_counter()
    try:
        cache = load_prompt_cache(str(path))
    except Exception as exc:  # noqa: BLE001 - mlx and mlx_lm raise many kinds on a damaged file
        first = (str(exc).splitlines() or [""])[0].split(". ")[0][:160]
        raise CacheUnusable(f"it is damaged ({type(exc).__name__}: {first})") from None
    _check_shape(backend, cache, ids)
    if metadata.get("crc32") != checksum(cache):
        raise CacheUnusable("it is damaged (its tensors do not match their checksum)")
    return Restored(cache=cache, ids=ids, seconds=time.perf_counter() - started)


def _held_ids(text: str) -> list[int]:
    try:
        ids = bounded_json.loads(text)
    except ValueError:
        ids = None
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and i >= 0 for i in ids):
        raise CacheUnusable("it is damaged (its token ids do not read back)")
    return ids


def _check_shape(backend: Any, cache: list[Any], ids: list[int]) -> None:
    """The layers a fresh cache of this backend would have (a quantized KV cache may stand for
    a plain one), holding as many tokens as the ids say."""
    fresh = backend.fresh_cache_layers()
    kinds = [type(c).__name__ for c in cache]
    allowed = [{type(c).__name__, "QuantizedKVCache"} if backend.options.kv_bits else {type(c).__name__}
               for c in fresh]
    if len(kinds) != len(allowed) or any(kind not in ok for kind, ok in zip(kinds, allowed)):
        raise CacheUnusable("it is damaged (its layers are not this model's)")
    offsets = [c.offset for c in cache if hasattr(c, "offset")]
    if offsets and offsets[0] != len(ids):
        raise CacheUnusable(f"it is damaged (it holds {offsets[0]} tokens, its ids say {len(ids)})")
