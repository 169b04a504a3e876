"""A disk tier under mlx_lm.server's prompt cache: what the engine prefilled survives an idle
unload, a crash and a restart of ``serve``.

The seam (``seam``) is mlx_lm's ``LRUPromptCache``, which ``enforcing`` makes in ``run``:

- ``fetch_nearest_cache``: when the memory tier has less of the prompt than a file on disk, the file
  is loaded (verified against the model's identity and its token ids), trimmed to the prefix the
  prompt shares, and only the rest is prefilled; the engine then counts it in ``cached_tokens``.
- ``insert_cache``: after a reply, its cache is copied in memory on the engine's thread (a copy,
  milliseconds) and handed to a writer thread, which writes it whole or not at all; a write that
  would wait is dropped, never waited for.

A file is keyed by the model's identity (a fingerprint of its weights, adapter and draft model, the
KV settings, mlx_lm's version) and the hash of its token ids (``store.prompt_files``). A prefix
shorter than ``MIN_TOKENS`` is not written, nor one that adds less than ``REWRITE_TOKENS`` (or a
quarter of its length) to a file on disk: an agent's growing prefix is written again only as it
grows by a quarter, so what is written in all stays within a few times the final file.
"""

from __future__ import annotations

import hashlib
import json
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any

from localchat.serve.engine import seam
from localchat.serve.engine.cache_breaks import Break, Outcome, Outcomes, later, parted, trie_break
from localchat.serve.engine.quantized_kv import KVQuantization, engine_form, stored_form
from localchat.store.prompt_files import FORMAT, MIN_TOKENS, PromptFiles, Stored, identity, token_ids, tokens_name

REWRITE_TOKENS = 1024
PENDING_WRITES = 2


def say(line: str) -> None:
    """One line in the engine's log (serve's ``logs/server-PORT.log``)."""
    print(f"localchat: prompt cache: {line}", file=sys.stderr, flush=True)


def common_prefix(a: tuple[int, ...], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def model_identity(model_key: Any, settings: dict[str, Any]) -> tuple[str, str] | None:
    """The identity of the model mlx_lm.server has loaded (``(path, adapter, draft)``) and its
    weights' fingerprint; None when its files cannot be found (then nothing is read or written)."""
    import mlx_lm

    from localchat.backends.saved_cache import model_fingerprint
    from localchat.registry import hub_snapshot

    def directory(name: Any) -> Path | None:
        if not isinstance(name, str):
            return None
        path = Path(name).expanduser()
        return path if path.is_dir() else hub_snapshot(name)

    parts = model_key if isinstance(model_key, tuple) else (model_key,)
    model_dir = directory(parts[0]) if parts else None
    if model_dir is None:
        return None
    fingerprint = model_fingerprint(model_dir, *(directory(p) for p in parts[1:]))
    return identity(fingerprint, {**settings, "mlx_lm": mlx_lm.__version__}), model_fingerprint(model_dir)


class DiskTier:
    """The files under the memory tier; ``settings`` the engine's KV options (part of a file's key),
    ``quantization`` how its caches quantize (a file holds mlx_lm's classes, the engine its own)."""

    def __init__(self, files: PromptFiles, settings: dict[str, Any], quantization: KVQuantization | None = None):
        self.files, self.settings, self.quantization = files, settings, quantization
        self._keys: dict[Any, str | None] = {}
        self._index: dict[str, dict[tuple[int, ...], Stored]] = {}
        self._lock = threading.Lock()
        self._pending: queue.Queue = queue.Queue(PENDING_WRITES)
        threading.Thread(target=self._write_loop, name="prompt-cache-writer", daemon=True).start()

    def _key(self, model_key: Any) -> str | None:
        if model_key not in self._keys:
            self._keys[model_key] = self._open(model_key)
        return self._keys[model_key]

    def _open(self, model_key: Any) -> str | None:
        """The model's directory made ready and its files indexed; None (said once) when it cannot be."""
        try:
            found = model_identity(model_key, self.settings)
            if found is None:
                return None
            key, weights = found
            self.files.prepare(key, weights)
            stored, ignored = self.files.stored(key)
        except OSError as exc:
            say(f"off for this model: {exc}")
            return None
        for line in ignored:
            say(f"ignored {line}")
        with self._lock:
            self._index[key] = {s.tokens: s for s in stored}
        say(f"{len(stored)} prefixes on disk for this model ({self.files.model_dir(key)})")
        return key

    def fetch(self, model_key: Any, tokens: list[int], in_memory: int) -> tuple[list[Any], int] | None:
        """A cache of more of ``tokens`` than ``in_memory`` from disk, and how many it holds."""
        key = self._key(model_key)
        if key is None or len(tokens) - 1 <= in_memory:
            return None
        with self._lock:
            entries = list(self._index.get(key, {}).values())
        ranked = sorted(((min(common_prefix(e.tokens, tokens), len(tokens) - 1), e) for e in entries),
                        key=lambda pair: -pair[0])
        for usable, entry in ranked:
            if usable <= in_memory or usable < MIN_TOKENS:
                return None
            cache = self._load(key, entry, usable)
            if cache is not None:
                return cache, usable
        return None

    def _load(self, key: str, entry: Stored, usable: int) -> list[Any] | None:
        files = seam.cache_files()
        started = time.perf_counter()
        try:
            cache, meta = files.load_prompt_cache(str(entry.path), return_metadata=True)
            if meta.get("format") != FORMAT or meta.get("identity") != key or \
                    token_ids(meta.get("tokens", "[]")) != entry.tokens:
                raise ValueError("its metadata does not match its name")
            if meta.get("digest") != digest(cache):
                raise ValueError("its tensors are not the ones written (a damaged file)")
            if len(entry.tokens) > usable:
                if not files.can_trim_prompt_cache(cache):
                    return None
                files.trim_prompt_cache(cache, len(entry.tokens) - usable)
            cache = engine_form(cache, self.quantization)
        except Exception as exc:  # a damaged or foreign file: the answer is as without it
            say(f"ignored {entry.path.name}: {type(exc).__name__}: {str(exc)[:200]}")
            with self._lock:
                self._index.get(key, {}).pop(entry.tokens, None)
            return None
        self.files.touch(entry.path)
        self._queue(("hit", key))
        say(f"{usable:,} tokens from disk ({entry.path.name}, {entry.size / 1e6:.1f} MB, "
            f"{time.perf_counter() - started:.3f}s)")
        return cache

    def nearest_break(self, model_key: Any, tokens: list[int]) -> Break | None:
        """Where ``tokens`` part from the file on disk that shares most of them, if that file goes on past it."""
        key = self._key(model_key)
        with self._lock:
            entries = list(self._index.get(key, {}).values()) if key is not None else []
        if not entries:
            return None
        shared, nearest = max(((common_prefix(e.tokens, tokens), e.tokens) for e in entries), key=lambda p: p[0])
        return parted(tokens, nearest, shared)

    def offer(self, model_key: Any, tokens: list[int], cache: list[Any]) -> None:
        """A reply's cache, written off the response path when it adds enough to what is on disk."""
        key = self._key(model_key)
        if key is None or len(tokens) < MIN_TOKENS:
            return
        with self._lock:
            held = max((common_prefix(e.tokens, tokens) for e in self._index.get(key, {}).values()), default=0)
        if held >= MIN_TOKENS and len(tokens) - held < max(REWRITE_TOKENS, len(tokens) // 4):
            return  # (what it adds is prefilled in little time; the whole file is not written again for it)
        self._queue(("write", key, tuple(tokens), frozen(stored_form(cache))))

    def _queue(self, job: tuple) -> None:
        try:
            self._pending.put_nowait(job)
        except queue.Full:
            if job[0] == "write":
                say(f"a write of {len(job[2]):,} tokens was dropped: the disk is behind")

    def _write_loop(self) -> None:
        while True:
            job = self._pending.get()
            try:
                if job[0] == "hit":
                    self.files.count_hit(job[1])
                else:
                    self._write(*job[1:])
            except Exception as exc:  # a full disk, a removed directory: the engine serves on
                say(f"a write failed: {type(exc).__name__}: {str(exc)[:200]}")

    def _write(self, key: str, tokens: tuple[int, ...], cache: list[Any]) -> None:
        started, name = time.perf_counter(), tokens_name(tokens)
        temp = self.files.temp_path(key, name)
        try:
            metadata = {"format": FORMAT, "identity": key, "tokens": json.dumps(tokens), "digest": digest(cache)}
            seam.cache_files().save_prompt_cache(str(temp), cache, metadata)
            path = self.files.place(temp, key, name)
        finally:
            temp.unlink(missing_ok=True)
        size = path.stat().st_size
        stored = Stored(path=path, tokens=tokens, size=size, used=time.time())
        with self._lock:
            index = self._index.setdefault(key, {})
            superseded = [e for e in index.values() if e.tokens != tokens and tokens[:len(e.tokens)] == e.tokens]
            for old in superseded:
                index.pop(old.tokens, None)
                old.path.unlink(missing_ok=True)
            index[tokens] = stored
        removed = self.files.evict(keep=path)
        with self._lock:
            for index in self._index.values():
                for gone in [t for t, e in index.items() if e.path in removed]:
                    index.pop(gone)
        say(f"wrote {len(tokens):,} tokens ({size / 1e6:.1f} MB, {size / len(tokens):,.0f} bytes a token) in "
            f"{time.perf_counter() - started:.3f}s off the response path" +
            (f"; {len(removed)} older files removed to stay within the bound" if removed else ""))


def frozen(cache: list[Any]) -> list[Any]:
    """A copy of ``cache`` made now, on the engine's thread: the writer thread then only writes
    arrays already computed (MLX's streams are the engine's)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    copies = [type(c).from_state(c.state) for c in cache]
    for copy, original in zip(copies, cache):
        if hasattr(original, "meta_state"):
            copy.meta_state = original.meta_state
    mx.eval([item[1] for item in tree_flatten([c.state for c in copies]) if isinstance(item[1], mx.array)])
    return copies


def digest(cache: list[Any]) -> str:
    """A hash of every array a cache holds, byte for byte in order: written into a file's metadata
    and checked when it is read, so a file whose tensors were damaged (its header intact) is
    ignored rather than served (~1.7 GB/s here, off the response path when written)."""
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten

    hashed = hashlib.sha256()
    for item in tree_flatten([c.state for c in cache]):
        value = item[1]
        if isinstance(value, mx.array):
            hashed.update(np.ascontiguousarray(np.array(value.view(mx.uint8), copy=False)).data)
    return hashed.hexdigest()


def tiered(base: type, disk: DiskTier | None, outcomes: Outcomes) -> type:
    """mlx_lm's ``LRUPromptCache`` with ``disk`` under it (when there is one), each prompt's outcome
    (its cached tokens, their tier, where it broke from its cache) kept in ``outcomes``."""

    class TieredPromptCache(base):
        def fetch_nearest_cache(self, model: Any, tokens: list[int]):
            cache, rest = super().fetch_nearest_cache(model, tokens)
            in_memory = len(tokens) - len(rest)
            broke = trie_break(self._trie, model, tokens)
            found = disk.fetch(model, tokens, in_memory) if disk is not None else None
            if disk is not None:
                broke = later(broke, disk.nearest_break(model, tokens))
            cached, tier = (found[1], "disk") if found is not None else (in_memory, "memory" if in_memory else "")
            outcomes.put(tokens, Outcome(cached=cached, tier=tier,
                                         broke=broke if broke is not None and broke.at >= cached else None))
            if found is None:
                if in_memory and disk is not None:
                    say(f"{in_memory:,} tokens from memory")
                return cache, rest
            return found[0], tokens[found[1]:]

        def insert_cache(self, model: Any, tokens: list[int], prompt_cache: list[Any], *, cache_type="assistant"):
            super().insert_cache(model, tokens, prompt_cache, cache_type=cache_type)
            if disk is None:
                return
            try:
                disk.offer(model, list(tokens), prompt_cache)
            except Exception as exc:  # never the engine's failure
                say(f"not written: {type(exc).__name__}: {str(exc)[:200]}")

    return TieredPromptCache


def disk_tier(settings: dict[str, Any], quantization: KVQuantization | None = None) -> DiskTier | None:
    """The tier serve asked for (``LOCALCHAT_PROMPT_CACHE_DIR``/``_DISK``), or None (bound 0, or a
    directory that cannot be used, said once)."""
    from localchat.store.prompt_files import root_from_env

    try:
        root, bound = root_from_env()
    except Exception as exc:
        say(f"off: {exc}")
        return None
    if bound <= 0:
        return None
    return DiskTier(PromptFiles(root, bound), settings, quantization)
