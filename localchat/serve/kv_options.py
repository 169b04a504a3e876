"""``serve --kv-bits``: what each served model's KV cache will be, checked before anything loads,
counted by the fit estimate (so by admission), and handed to its engine.

``--kv-bits 8`` applies to every model; ``--kv-bits NAME=4`` to one (given after, it wins for that
model). ``--kv-group-size`` unset is mlx_lm's 64 where it divides a model's head dimension, else the
largest that does (the demo's heads have 32). ``--quantized-kv-start`` is 0 in serve: the cache is
what many users run out of, and a batch has one switch point for all its rows (docs/kv-cache.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from localchat.backends.mlx_options import DEFAULT_KV_GROUP_SIZE, KV_BITS, KV_GROUP_SIZES
from localchat.errors import UsageError
from localchat.fit.estimate import KVSettings
from localchat.fit.shape import ModelShape

SERVE_QUANTIZED_KV_START = 0
ENGINE_KV_FLAGS = ("--kv-bits", "--kv-group-size", "--quantized-kv-start")


@dataclass(frozen=True)
class KVChoice:
    """What ``serve`` was asked for the KV caches, for all models and by name."""

    bits: int | None = None
    by_model: dict[str, int] = field(default_factory=dict)
    group_size: int | None = None
    start: int = SERVE_QUANTIZED_KV_START

    def bits_for(self, names: frozenset[str]) -> int | None:
        return next((bits for name, bits in self.by_model.items() if name in names), self.bits)

    def settings_for(self, names: frozenset[str], shape: ModelShape, model: str) -> KVSettings:
        """This model's KV settings; a group size that does not divide its heads is a usage error."""
        bits = self.bits_for(names)
        if bits is None:
            return KVSettings()
        return KVSettings(bits=bits, group_size=group_for(shape.head_dim, self.group_size, model),
                          quantized_start=self.start, on_write=True)


NO_KV_CHOICE = KVChoice()


def _bits(text: str, given: str) -> int:
    if not text.strip().isdecimal() or int(text) not in KV_BITS:
        raise UsageError(f"--kv-bits {given}: the bits must be one of {', '.join(map(str, KV_BITS))} (what MLX "
                         "quantizes to), e.g. --kv-bits 8 or --kv-bits smollm2=4")
    return int(text)


def parse_kv_choice(given: list[str], group_size: int | None, start: int | None) -> KVChoice:
    """``--kv-bits`` as given (``8``, ``NAME=4``, repeatable), with the group and the start."""
    bits: int | None = None
    by_model: dict[str, int] = {}
    for text in given:
        name, sep, value = text.rpartition("=")
        if sep and not name.strip():
            raise UsageError(f"--kv-bits {text}: name the model before =, e.g. --kv-bits smollm2=4")
        if sep:
            by_model[name.strip()] = _bits(value, text)
        else:
            bits = _bits(value, text)
    if group_size is not None and group_size not in KV_GROUP_SIZES:
        raise UsageError(f"--kv-group-size must be one of {', '.join(map(str, KV_GROUP_SIZES))}, not {group_size}")
    if start is not None and start < 0:
        raise UsageError(f"--quantized-kv-start must be 0 or more tokens, not {start}")
    return KVChoice(bits=bits, by_model=by_model, group_size=group_size,
                    start=SERVE_QUANTIZED_KV_START if start is None else start)


def group_for(head_dim: int, asked: int | None, model: str) -> int:
    """mx.quantize groups along a head's dimension: the size asked if it divides it, else a usage
    error; unset, 64 where it divides, else the largest that does."""
    fits = [g for g in KV_GROUP_SIZES if head_dim % g == 0]
    if asked is None:
        if not fits:
            raise UsageError(f"--kv-bits: {model}'s heads have {head_dim} dimensions, which no KV group size "
                             f"({', '.join(map(str, KV_GROUP_SIZES))}) divides: serve it without --kv-bits")
        return DEFAULT_KV_GROUP_SIZE if DEFAULT_KV_GROUP_SIZE in fits else fits[-1]
    if head_dim % asked:
        hint = f": use --kv-group-size {fits[-1]}, or leave it out" if fits else ""
        raise UsageError(f"--kv-group-size {asked} does not divide {model}'s head dimension ({head_dim}){hint}")
    return asked


def engine_args(kv: KVSettings) -> tuple[str, ...]:
    """mlx_lm.server's own flags for ``kv`` (our engine takes them from there)."""
    if kv.bits is None:
        return ()
    return ("--kv-bits", str(kv.bits), "--kv-group-size", str(kv.group_size),
            "--quantized-kv-start", str(kv.quantized_start))


def refuse_engine_kv_flags(extra: tuple[str, ...]) -> None:
    """``serve -- --kv-bits 8`` would skip the checks and the fit: serve's own options instead."""
    for arg in extra:
        if arg.split("=", 1)[0] in ENGINE_KV_FLAGS:
            raise UsageError(f"{arg.split('=', 1)[0]} is serve's own option now: give it before -- "
                             "(localchat serve -m MODEL --kv-bits 8), so the fit and ps count it")

