"""Whether a model may load now: the estimates of what is loaded plus the new one, held against
the budget. Idle models make room, least recently used first; busy ones are waited for; pinned
ones never move. A pure function: the pool carries out what it says."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Resident:
    """A model holding memory now (loaded, loading or unloading)."""

    key: str
    bytes: int
    busy: bool  # a request in flight, or loading/unloading: it cannot be unloaded now
    last_used: float  # monotonic seconds
    pinned: bool = False


@dataclass(frozen=True)
class Admission:
    unload: tuple[str, ...] = ()  # idle models to unload first, least recently used first
    wait_for: tuple[str, ...] = ()  # busy models that must go idle (and be unloaded) first
    refused: str | None = None  # why the model cannot load, whatever is unloaded


def admit(need: int, residents: list[Resident], budget: int | None, force: bool = False) -> Admission:
    """What must happen before a model estimated at ``need`` bytes loads within ``budget``."""
    if budget is None:
        return Admission()
    used = sum(r.bytes for r in residents)
    if used + need <= budget:
        return Admission()
    if need > budget and not force:
        return Admission(refused="alone")
    movable = sorted((r for r in residents if not r.pinned), key=lambda r: r.last_used)
    unload = _lightened([r for r in movable if not r.busy], used, need, budget)
    used -= sum(r.bytes for r in movable if r.key in unload)
    if used + need <= budget or force:
        return Admission(unload=unload)
    wait_for = _lightened([r for r in movable if r.busy], used, need, budget)
    if used - sum(r.bytes for r in movable if r.key in wait_for) + need <= budget:
        return Admission(wait_for=wait_for)
    return Admission(refused="pinned")


def _lightened(candidates: list[Resident], used: int, need: int, budget: int) -> tuple[str, ...]:
    """The fewest of ``candidates``, in order, whose going makes room (all of them if none does)."""
    chosen = []
    for resident in candidates:
        if used + need <= budget:
            break
        chosen.append(resident.key)
        used -= resident.bytes
    return tuple(chosen)
