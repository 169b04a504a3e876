"""Does a model fit: its estimate against the machine's budget, and what would help when it is
tight or does not fit; the module ``fit.check`` judges a model with it for ``chat``, ``serve``,
``bench``, ``load`` and ``pull`` before a byte is downloaded or a weight is loaded."""

from __future__ import annotations

from dataclasses import dataclass, replace

from localchat.errors import LocalchatError
from localchat.fit.budget import MemoryBudget
from localchat.fit.estimate import KVSettings, MemoryEstimate, estimate
from localchat.fit.shape import ModelShape
from localchat.sizes import shown_size

DEFAULT_CONTEXT = 8192  # the context a fit is judged at when the user sets none (LM Studio's 4k, doubled)
TIGHT = 0.85


@dataclass(frozen=True)
class FitReport:
    estimate: MemoryEstimate
    budget: MemoryBudget | None
    verdict: str  # "fits" | "tight" | "does not fit" | "unknown" (the machine says nothing of its memory)
    helps: tuple[str, ...] = ()
    capacity: str = ""  # at each KV width: the longest context, and the users that fit (``capacity``)

    @property
    def share(self) -> float | None:
        return self.estimate.total / self.budget.bytes if self.budget else None


def fit_context(shape: ModelShape, asked: int | None) -> int:
    """The context a fit is judged at: the user's budget, else 8k, never past the model's window."""
    context = asked or DEFAULT_CONTEXT
    if shape.context_window:
        context = min(context, shape.context_window)
    return max(context, 1)


def _verdict(total: int, budget: MemoryBudget | None) -> str:
    if budget is None:
        return "unknown"
    share = total / budget.bytes
    return "fits" if share <= TIGHT else "tight" if share <= 1 else "does not fit"


def _longest_within(shape: ModelShape, room: int, kv: KVSettings, metal: bool, top: int, step: int) -> int:
    """The longest context up to ``top``, in steps of ``step``, whose estimate keeps within ``room``
    (halving: the estimate grows with the context); 0 when even one step does not."""
    low, high, best = 1, top // step, 0
    while low <= high:
        mid = (low + high) // 2
        if estimate(shape, mid * step, kv, metal).total <= room:
            best, low = mid * step, mid + 1
        else:
            high = mid - 1
    return best


def _shorter_context(shape: ModelShape, context: int, kv: KVSettings, room: int, metal: bool) -> int | None:
    """The longest context (in steps of 512) that keeps within ``room``; None when even 512 does not."""
    best = _longest_within(shape, room, kv, metal, context, 512)
    return best if 0 < best < context else None


def _helps(shape: ModelShape, context: int, kv: KVSettings, budget: MemoryBudget, metal: bool,
           smaller: tuple[str, ...]) -> tuple[str, ...]:
    room = int(budget.bytes * TIGHT)
    found = []
    if (shorter := _shorter_context(shape, context, kv, room, metal)) is not None:
        found.append(f"--max-context-tokens {shorter}")
    if kv.bits is None:
        quantized = estimate(shape, context, replace(kv, bits=8), metal).total
        if quantized <= budget.bytes:
            found.append(f"--kv-bits 8 ({shown_size(quantized)})")
    found += [f"a smaller variant: {name}" for name in smaller]
    return tuple(found)


def judge(shape: ModelShape, budget: MemoryBudget | None, *, context: int | None = None,
          kv: KVSettings | None = None, metal: bool = False, smaller: tuple[str, ...] = ()) -> FitReport:
    kv = kv or KVSettings()
    at = fit_context(shape, context)
    guess = estimate(shape, at, kv, metal)
    verdict = _verdict(guess.total, budget)
    helps = _helps(shape, at, kv, budget, metal, smaller) if budget and verdict in ("tight", "does not fit") else ()
    room = capacity(shape, budget, context, kv.bits, metal) if budget else ""
    return FitReport(estimate=guess, budget=budget, verdict=verdict, helps=helps, capacity=room)


def terms(report: FitReport) -> str:
    e = report.estimate
    return (f"weights {shown_size(e.weights)} + KV cache {shown_size(e.kv_cache)} + prefill {shown_size(e.prefill)} "
            f"+ runtime {shown_size(e.overhead)}")


def summary(name: str, report: FitReport) -> str:
    """One line: what the model needs, what the machine gives, the verdict and what would help."""
    e, budget = report.estimate, report.budget
    line = f"{name} needs ~{shown_size(e.total)} at {e.context:,} tokens of context ({terms(report)})"
    if budget is None:
        return line + "; this machine does not say how much memory it has"
    line += f"; {budget.source} is {shown_size(budget.bytes)} ({report.share:.0%}): {report.verdict}"
    if report.helps:
        line += "; would help: " + ", ".join(report.helps)
    return line


CAPACITY_BITS = (None, 8, 4)
MAX_CONTEXT = 1 << 20  # a million tokens: past any window a Mac holds


def longest_context(shape: ModelShape, room: int, kv: KVSettings, metal: bool) -> int:
    """The most tokens (in steps of 256) one user's context may hold within ``room``; 0 when none."""
    return _longest_within(shape, room, kv, metal, min(shape.context_window or MAX_CONTEXT, MAX_CONTEXT), 256)


def users_at(shape: ModelShape, room: int, context: int, kv: KVSettings, metal: bool) -> int:
    """How many users at ``context`` each fit: the weights once, a prefill at a time, a KV cache each."""
    one = estimate(shape, context, kv, metal)
    if one.total > room:
        return 0
    return 1 + (room - one.total) // max(1, one.kv_cache)


def capacity(shape: ModelShape, budget: MemoryBudget, context: int | None, asked_bits: int | None,
             metal: bool = False) -> str:
    """What a Mac user asks before starting an agent: at each KV width (as serve's engine holds
    the cache, quantized from the first token), the longest context one user may have, and how
    many users fit at the context judged."""
    at = fit_context(shape, context)
    parts = []
    for bits in CAPACITY_BITS:
        kv = KVSettings(bits=bits, group_size=64 if shape.head_dim % 64 == 0 else 32, on_write=bits is not None)
        longest = longest_context(shape, budget.bytes, kv, metal)
        name = f"{bits}-bit" if bits else "unquantized"
        mark = " (asked)" if bits == asked_bits else ""
        whole = " (its whole window)" if shape.context_window and longest >= shape.context_window else ""
        parts.append(f"{name}{mark}: {estimate(shape, at, kv, metal).kv_cache / at:,.0f} bytes a token, one user up "
                     f"to {longest:,} tokens{whole}, {users_at(shape, budget.bytes, at, kv, metal)} users at {at:,}")
    return f"KV cache in {budget.source} ({shown_size(budget.bytes)}): " + "; ".join(parts)


def refuse_unless_fits(name: str, report: FitReport, force: bool) -> None:
    """A model that does not fit is one line (exit 1), unless ``--force``."""
    if report.verdict == "does not fit" and not force:
        raise LocalchatError(summary(name, report) + " (--force to try anyway)")
