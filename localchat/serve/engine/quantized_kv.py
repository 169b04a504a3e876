"""A quantized KV cache that keeps mlx_lm's continuous batching (``serve --kv-bits``).

mlx_lm 0.32 has a ``QuantizedKVCache`` for one sequence and a ``BatchKVCache`` for a batch, but no
batch of quantized caches: its server serves one request at a time when ``--kv-bits`` is set. Here:

- ``QuantizedBatchKVCache`` is ``BatchKVCache`` with its keys and values held as ``mx.quantize``'s
  (packed, scales, biases) triples: the same left padding, mask, prepare/finalize, filter, extend,
  extract and merge, each applied to the three arrays alike. Attention goes through mlx_lm's
  ``quantized_scaled_dot_product_attention``, which mlx_lm's models choose for any cache that has
  ``bits`` (``seam``).
- ``QuantizingKVCache`` (one sequence) and ``QuantizingBatchKVCache`` (a batch) hold mlx_lm's 16-bit
  cache until ``--quantized-kv-start`` tokens are held, then its quantized form; they pass every
  other call on to what they hold, so ``bits`` appears exactly when the keys are quantized. In a
  batch the switch is the batch's: when its longest row holds ``start`` tokens every row is
  quantized, and a row joining a quantized batch is quantized as it joins (a batch has one layout
  a layer). ``serve`` starts at 0 (docs/kv-cache.md says why).

Quantizing a token's key is per token (groups run along the head's dimension), so a row quantized
alone or in a batch holds the same values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx.utils import tree_map

from localchat.serve.engine import seam


@dataclass(frozen=True)
class KVQuantization:
    """``--kv-bits``, ``--kv-group-size``, ``--quantized-kv-start``, as one engine uses them."""

    bits: int
    group_size: int
    start: int = 0

    def quantize(self, x: mx.array) -> tuple[mx.array, ...]:
        return tuple(mx.quantize(x, group_size=self.group_size, bits=self.bits))


_CACHE = seam.cache_files()
_BatchKVCache: Any = _CACHE.BatchKVCache


class QuantizedBatchKVCache(_BatchKVCache):
    """mlx_lm's ``BatchKVCache`` with quantized keys and values (see the module's docstring)."""

    keys: Any  # (packed, scales, biases), or None while empty; so are ``values``
    values: Any
    offset: Any  # each row's position (an array), as mlx_lm's
    left_padding: Any
    _idx: int

    def __init__(self, left_padding: list[int], quantization: KVQuantization):
        super().__init__(left_padding)
        self.quantization = quantization
        self.bits, self.group_size = quantization.bits, quantization.group_size

    @classmethod
    def of(cls, batch: Any, quantization: KVQuantization) -> QuantizedBatchKVCache:
        """A 16-bit ``BatchKVCache`` quantized as it stands (its padding and positions kept)."""
        made = cls([], quantization)
        made.offset, made.left_padding, made._idx = batch.offset, batch.left_padding, batch._idx
        made._right_padding = batch._right_padding
        if batch.keys is not None:
            made.keys, made.values = quantization.quantize(batch.keys), quantization.quantize(batch.values)
        return made

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        prev, steps = self._idx, keys.shape[2]
        if self.keys is None or prev + steps > self.keys[0].shape[2]:
            self._grow(keys, values, prev, steps)
        self.offset = self.offset + steps
        self._idx += steps
        for stored, new in ((self.keys, self.quantization.quantize(keys)),
                            (self.values, self.quantization.quantize(values))):
            for part, value in zip(stored, new):
                part[..., prev:self._idx, :] = value
        return self.keys_and_values()

    def _grow(self, keys: mx.array, values: mx.array, prev: int, steps: int) -> None:
        size = (self.step + steps - 1) // self.step * self.step
        more_keys = self.quantization.quantize(mx.zeros((*keys.shape[:2], size, keys.shape[3]), keys.dtype))
        more_values = self.quantization.quantize(mx.zeros((*values.shape[:2], size, values.shape[3]),
                                                          values.dtype))
        if self.keys is None:
            self.keys, self.values = more_keys, more_values
            return
        kept = tree_map(lambda x: x[..., :prev, :], (self.keys, self.values))
        self.keys, self.values = tree_map(lambda a, b: mx.concatenate([a, b], axis=2), kept,
                                          (more_keys, more_values))

    def keys_and_values(self):
        return tree_map(lambda x: x[..., :self._idx, :], (self.keys, self.values))

    def finalize(self):
        if self._right_padding is not None:
            padding = self._right_padding[:, None]
            self.keys, self.values = tree_map(lambda x: _CACHE.dynamic_roll(x, padding, axis=2),
                                              (self.keys, self.values))
            self.offset = self.offset - self._right_padding
            self.left_padding += self._right_padding
            self._right_padding = None

    def filter(self, batch_indices):
        if self.keys is not None:
            self.keys, self.values = tree_map(lambda x: x[batch_indices], (self.keys, self.values))
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        least = min(self.left_padding.tolist())
        if least > 0:
            if self.keys is not None:
                self.keys, self.values = tree_map(lambda x: x[..., least:, :], (self.keys, self.values))
            self._idx -= least
            self.left_padding -= least

    def extend(self, other):
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        idx = max(self._idx, other._idx)
        size = max(c.keys[0].shape[2] for c in (self, other) if c.keys is not None)
        template = (self if self.keys is not None else other)
        parts = [_right_justified(c, idx, size, template) for c in (self, other)]
        self.keys = tree_map(lambda a, b: mx.concatenate([a, b]), parts[0][0], parts[1][0])
        self.values = tree_map(lambda a, b: mx.concatenate([a, b]), parts[0][1], parts[1][1])
        self.offset = mx.concatenate([self.offset, other.offset])
        self.left_padding = mx.concatenate([parts[0][2], parts[1][2]])
        self._idx = idx

    def extract(self, idx):
        single = _CACHE.QuantizedKVCache(group_size=self.group_size, bits=self.bits)
        padding = self.left_padding.tolist()[idx]
        single.keys, single.values = tree_map(lambda x: mx.contiguous(x[idx:idx + 1, :, padding:self._idx]),
                                              (self.keys, self.values))
        single.offset = self._idx - padding
        return single

    @classmethod
    def merge_quantized(cls, caches: list[Any], quantization: KVQuantization):
        """One batch of single quantized caches (each ``QuantizedKVCache``), left-padded."""
        lengths = [c.offset if c.keys is not None else 0 for c in caches]
        longest = max(lengths)
        merged = cls([longest - n for n in lengths], quantization)
        if longest == 0:
            return merged
        model = next(c for c in caches if c.keys is not None)
        merged.keys, merged.values = tree_map(
            lambda x: mx.zeros((len(caches), x.shape[1], longest, x.shape[3]), x.dtype), (model.keys, model.values))
        for row, (n, c) in enumerate(zip(lengths, caches)):
            if n:
                for stored, held in ((merged.keys, c.keys), (merged.values, c.values)):
                    for part, value in zip(stored, held):
                        part[row:row + 1, :, longest - n:longest] = value[..., :n, :]
        merged.offset += longest
        merged._idx = longest
        return merged

    @property
    def nbytes(self):
        if self.keys is None:
            return 0
        return sum(x.nbytes for x in (*self.keys, *self.values))


def _right_justified(cache: Any, idx: int, size: int, template: Any):
    """A batch's quantized keys and values padded so its last column is ``idx`` in ``size`` columns
    (as ``BatchKVCache.extend`` pads its arrays), and its left padding grown to match."""
    rows = cache.offset.shape[0]
    if cache.keys is None:
        keys, values = tree_map(lambda x: mx.zeros((rows, x.shape[1], 0, x.shape[3]), x.dtype),
                                (template.keys, template.values))
    else:
        keys, values = cache.keys, cache.values
    left = idx - cache._idx
    right = size - keys[0].shape[2] - left
    if right < 0:
        keys, values = tree_map(lambda x: x[..., :right, :], (keys, values))
        right = 0
    if left or right:
        keys, values = tree_map(lambda x: mx.pad(x, [(0, 0), (0, 0), (left, right), (0, 0)]), (keys, values))
    return keys, values, cache.left_padding + left


Track = Callable[[Any], Any]  # each cache made is handed to it (the engine's ledger); a plain function


def _untracked(cache: Any) -> Any:
    return cache


OWN_FIELDS = ("held", "quantization", "track")


class _Holding:
    """What the two switching caches share: every call they do not make their own goes to the cache
    they hold (so ``bits`` is there exactly when it is quantized). ``quantization`` None: never."""

    def __init__(self, quantization: KVQuantization | None, held: Any, track: Track = _untracked):
        self.quantization, self.held, self.track = quantization, held, track
        track(self)

    def __getattr__(self, name: str) -> Any:
        if name in OWN_FIELDS:  # (copy and deepcopy make one before its fields are set)
            raise AttributeError(name)
        return getattr(self.held, name)

    def __setattr__(self, name: str, value: Any) -> None:
        """What a model sets on its cache goes to the cache held (a pipeline's last layer ties its
        ``keys`` to the send: ``cache[-1].keys = mx.depends(...)``)."""
        if name in OWN_FIELDS:
            object.__setattr__(self, name, value)
        else:
            setattr(self.held, name, value)

    @property
    def quantized(self) -> bool:
        return hasattr(self.held, "bits")

    def _due(self, held_tokens: int) -> bool:
        return self.quantization is not None and not self.quantized and held_tokens >= self.quantization.start


class QuantizingKVCache(_Holding):
    """One sequence's layer: mlx_lm's ``KVCache`` until ``start`` tokens are held, then its
    ``QuantizedKVCache``. What the prompt cache keeps and what a batch is merged from."""

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        if self._due(self.held.offset):
            self.held = self.quantized_form()
        return self.held.update_and_fetch(keys, values)

    def quantized_form(self) -> Any:
        """What it holds as a ``QuantizedKVCache`` (quantized now if it was not)."""
        q = self.quantization
        assert q is not None
        return self.held if self.quantized else self.held.to_quantized(group_size=q.group_size, bits=q.bits)

    @classmethod
    def merge(cls, caches: list[QuantizingKVCache]) -> QuantizingBatchKVCache:
        quantization, track = caches[0].quantization, caches[0].track
        if quantization is not None and any(c.quantized for c in caches):
            held = QuantizedBatchKVCache.merge_quantized([c.quantized_form() for c in caches], quantization)
        else:
            held = _CACHE.BatchKVCache.merge([c.held for c in caches])
        return QuantizingBatchKVCache(quantization, held, track)


class QuantizingBatchKVCache(_Holding):
    """A batch's layer: mlx_lm's ``BatchKVCache`` until its longest row holds ``start`` tokens,
    then a ``QuantizedBatchKVCache``; a batch joined to a quantized one is quantized first."""

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        if self._due(self.held._idx):
            assert self.quantization is not None
            self.held = QuantizedBatchKVCache.of(self.held, self.quantization)
        return self.held.update_and_fetch(keys, values)

    def extend(self, other: QuantizingBatchKVCache) -> None:
        if self.quantization is not None and self.quantized != other.quantized:
            for batch in (self, other):
                if not batch.quantized:
                    batch.held = QuantizedBatchKVCache.of(batch.held, self.quantization)
        self.held.extend(other.held)
        self.track(self)  # (it holds more rows now)

    @property
    def rows(self) -> int:
        return int(self.held.offset.shape[0])

    def extract(self, idx: int) -> QuantizingKVCache:
        return QuantizingKVCache(self.quantization, self.held.extract(idx), self.track)


def quantizing(make_prompt_cache: Any, quantization: KVQuantization | None, track: Track = _untracked) -> Any:
    """mlx_lm's ``make_prompt_cache`` with each plain ``KVCache`` layer a ``QuantizingKVCache`` (a
    sliding-window or state layer stays as the model made it: mlx_lm quantizes none of those)."""

    def made(model: Any, max_kv_size: int | None = None) -> list[Any]:
        return [QuantizingKVCache(quantization, c, track) if type(c) is _CACHE.KVCache else c
                for c in make_prompt_cache(model, max_kv_size)]

    return made


def stored_form(cache: list[Any]) -> list[Any]:
    """A cache as a file holds it: mlx_lm's own classes (what ``load_prompt_cache`` can make)."""
    return [c.held if isinstance(c, QuantizingKVCache) else c for c in cache]


def engine_form(cache: list[Any], quantization: KVQuantization | None, track: Track = _untracked) -> list[Any]:
    """A cache read from a file, as this engine decodes with it."""
    plain = (_CACHE.KVCache, _CACHE.QuantizedKVCache)
    return [QuantizingKVCache(quantization, c, track) if type(c) in plain else c for c in cache]
