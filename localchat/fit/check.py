"""The fit of a named model on this machine, as every command that loads one checks it first."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from localchat.fit.budget import machine_budget
from localchat.fit.estimate import KVSettings
from localchat.fit.shape import ModelShape, local_shape
from localchat.fit.verdict import FitReport, judge, refuse_unless_fits


@dataclass(frozen=True)
class FitSettings:
    """What the user set that changes the fit: ``--memory-limit``, the context they will use
    (``--max-context-tokens``), the KV cache's ``--kv-bits``/``--max-kv-size``, and ``--force``."""

    memory_limit: int | None = None
    context: int | None = None
    kv: KVSettings = KVSettings()
    force: bool = False


def on_metal() -> bool:
    """MLX computes on the GPU here (Metal's fused attention applies)."""
    from localchat.environment import mlx_device

    return mlx_device()[0] == "gpu"


def _bits(variant: str) -> float:
    found = re.search(r"\d+(\.\d+)?", variant)
    return float(found[0]) if found else 99.0


def smaller_variants(ref) -> tuple[str, ...]:
    """The registry's variants of ``ref`` with fewer bits than the one in use, fewest last."""
    variants = ref.entry.variants if ref.entry is not None else {}
    current = next((name for name, repo in variants.items() if repo == ref.location), None)
    ceiling = _bits(current) if current else 99.0
    names = sorted((v for v in variants if _bits(v) < ceiling), key=_bits, reverse=True)
    return tuple(f"{ref.entry.id}@{v}" for v in names)


def judge_shape(shape: ModelShape, settings: FitSettings, smaller: tuple[str, ...] = ()) -> FitReport:
    return judge(shape, machine_budget(settings.memory_limit), context=settings.context, kv=settings.kv,
                 metal=on_metal(), smaller=smaller)


def check_local(name: str, model_dir: Path, settings: FitSettings, smaller: tuple[str, ...] = ()) -> FitReport:
    """Judge a model on this machine; one that does not fit stops here (exit 1) unless forced."""
    report = judge_shape(local_shape(model_dir), settings, smaller)
    refuse_unless_fits(name, report, settings.force)
    return report
