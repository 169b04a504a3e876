"""The engine's KV caches: made by us (``quantized_kv``) wherever mlx_lm makes one, so that
``--kv-bits`` keeps the batch and ``ps`` can say how much they hold.

mlx_lm.server batches only without ``--kv-bits`` (``ResponseGenerator._is_batchable``). The engine
takes the flag, its group and its start from mlx_lm's own arguments, then clears ``kv_bits`` there:
mlx_lm batches as usual, and the caches it makes (``make_prompt_cache``, in its batch and in its
one-at-a-time path) are ours, which quantize themselves. Without ``--kv-bits`` they are the same
caches that never quantize, so both engines are counted alike.
"""

from __future__ import annotations

import json
import threading
import weakref
from typing import TYPE_CHECKING, Any

from localchat.serve.engine import seam

if TYPE_CHECKING:
    from localchat.serve.engine.quantized_kv import KVQuantization


class KVLedger:
    """Every KV cache the engine holds now (the batch's, the prompt cache's), weakly: one a cache is
    made, gone when it is."""

    def __init__(self) -> None:
        self._held: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()
        self.largest_batch = 0  # the most requests one batch has decoded together

    def track(self, cache: Any) -> Any:
        with self._lock:
            self._held.add(cache)
            self.largest_batch = max(self.largest_batch, getattr(cache, "rows", 0))
        return cache

    def nbytes(self) -> int:
        with self._lock:
            held = list(self._held)
        return sum(c.nbytes for c in held)

    def batch_size(self) -> int:
        """The requests one batch holds now (its rows)."""
        with self._lock:
            held = list(self._held)
        return max((getattr(c, "rows", 0) for c in held), default=0)


def quantization_of(cli_args: Any) -> KVQuantization | None:
    """What mlx_lm's arguments ask (``--kv-bits``, ``--kv-group-size``, ``--quantized-kv-start``)."""
    from localchat.serve.engine.quantized_kv import KVQuantization

    bits = getattr(cli_args, "kv_bits", None)
    if bits is None:
        return None
    return KVQuantization(bits=bits, group_size=cli_args.kv_group_size, start=cli_args.quantized_kv_start)


def install(server: Any, cli_args: Any, ledger: KVLedger) -> KVQuantization | None:
    """Our caches wherever mlx_lm makes one, each counted in ``ledger``; ``kv_bits`` cleared in
    mlx_lm's arguments (it is ours now)."""
    from localchat.serve.engine.quantized_kv import quantizing  # (mlx_lm's classes: after the seam's check)

    quantization = quantization_of(cli_args)
    cli_args.kv_bits = None
    generation: Any = seam.generation()
    made = quantizing(generation.make_prompt_cache, quantization, lambda cache: ledger.track(cache))
    server.make_prompt_cache = generation.make_prompt_cache = made
    return quantization


def report(quantization: KVQuantization | None, ledger: KVLedger, last_break: dict[str, Any] | None) -> bytes:
    """What ``GET /localchat/kv`` answers: the bits, the bytes the engine's KV caches hold now, the
    most requests one batch has held, and the latest prompt that broke from its cache (``ps``)."""
    return json.dumps({"bits": quantization.bits if quantization else None,
                       "group_size": quantization.group_size if quantization else None,
                       "start": quantization.start if quantization else None,
                       "bytes": ledger.nbytes(), "largest_batch": ledger.largest_batch,
                       "last_break": last_break}).encode()

