"""How sure a figure is: the one statistics module of bench, ``bench compare`` and load.

Turns of one conversation share its fate (a fact it forgot is forgotten at every later turn), so
every interval here treats the conversation as the unit (Miller 2024, "Adding Error Bars to Evals"):
an accuracy's 95 % interval from the cluster-robust standard error, a median's from a bootstrap that
resamples whole conversations (seeded: the same run gives the same interval). Two arms that played
the same conversations are compared pair by pair: the accuracy difference with a paired clustered
interval and an exact McNemar test on the turns where they disagree; a TTFT or token ratio with a
paired bootstrap (one resample of conversations for both arms).

numpy alone: the exact binomial tail is a sum of ``math.comb`` terms, and a bootstrap is a few lines
of indexing, so scipy (~40 MB) buys nothing here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Z95 = 1.959963984540054
BOOTSTRAP_RESAMPLES = 2000
SEED = 20261204


@dataclass(frozen=True)
class Interval:
    """A figure and its 95 % interval; ``low``/``high`` None when none can be given (and ``why``)."""

    value: float | None
    low: float | None = None
    high: float | None = None
    why: str | None = None  # why there is no interval

    @property
    def known(self) -> bool:
        return self.low is not None and self.high is not None

    def spans(self, null: float) -> bool:
        """The interval holds ``null`` (0 for a difference, 1 for a ratio): no difference shown."""
        return self.low is None or self.high is None or self.low <= null <= self.high

    def as_dict(self) -> dict:
        return {"value": self.value, "low": self.low, "high": self.high, **({"why": self.why} if self.why else {})}


Clusters = Sequence[Sequence[float]]  # one sequence of values a conversation


def cluster_mean(clusters: Clusters, share: bool = False) -> Interval:
    """The mean of every value with a 95 % interval from the cluster-robust standard error
    (Liang-Zeger, with the J/(J-1) correction). A ``share`` (an accuracy: 0/1 values) gets a Wilson
    interval on the effective sample size (n over the design effect of its clustering), which stays
    inside [0, 1] and does not collapse to a point at 0 % or 100 %."""
    kept = [c for c in clusters if len(c)]
    n = sum(len(c) for c in kept)
    if not n:
        return Interval(None, why="no scored turns")
    mean = sum(sum(c) for c in kept) / n
    if len(kept) < 2:
        return Interval(mean, why="one conversation: an interval needs two or more")
    spread = sum((sum(c) - mean * len(c)) ** 2 for c in kept) / n ** 2  # the clustered variance, uncorrected
    if share:
        independent = mean * (1 - mean) / n
        design_effect = max(1.0, spread / independent) if independent else 1.0
        return wilson(mean, n / design_effect)
    j = len(kept)
    half = Z95 * math.sqrt(j / (j - 1) * spread)
    return Interval(mean, mean - half, mean + half)


def wilson(share: float, n: float) -> Interval:
    """The Wilson score interval of a share observed over ``n`` (effective) trials."""
    z2 = Z95 ** 2
    centre = (share + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 / (1 + z2 / n) * math.sqrt(share * (1 - share) / n + z2 / (4 * n ** 2))
    return Interval(share, max(0.0, centre - half), min(1.0, centre + half))


def paired_difference(pairs: Sequence[Sequence[tuple[float, float]]]) -> Interval:
    """The mean of (a - b) over turns paired within conversations, with a cluster-robust interval."""
    return cluster_mean([[a - b for a, b in c] for c in pairs]) if pairs else Interval(None, why="no pairs")


def mcnemar_p(pairs: Sequence[tuple[bool, bool]]) -> float | None:
    """The exact (binomial) McNemar test's two-sided p-value over paired outcomes; None without any
    turn where the two disagree (nothing to test), as the test is defined on discordant pairs only."""
    b = sum(1 for x, y in pairs if x and not y)
    c = sum(1 for x, y in pairs if y and not x)
    n = b + c
    if n == 0:
        return None
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def bootstrap(clusters: Sequence[Sequence[float]], statistic: Callable[[list[float]], float | None] = statistics.median,
              seed: int = SEED, resamples: int = BOOTSTRAP_RESAMPLES) -> Interval:
    """``statistic`` of all values (a median) and its 95 % percentile interval, resampling whole
    conversations with replacement."""
    kept = [list(c) for c in clusters if len(c)]
    if not kept:
        return Interval(None, why="no values")
    value = statistic([v for c in kept for v in c])
    if len(kept) < 2:
        return Interval(value, why="one conversation: an interval needs two or more")
    return _percentiles(value, [statistic([v for i in draw for v in kept[i]]) for draw in _draws(len(kept), seed,
                                                                                               resamples)])


def paired_ratio(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]],
                 statistic: Callable[[list[float]], float] = statistics.median, seed: int = SEED,
                 resamples: int = BOOTSTRAP_RESAMPLES) -> Interval:
    """statistic(a) / statistic(b) for two arms that played the same conversations (``a[i]`` and
    ``b[i]`` are one conversation), each resample drawing the same conversations for both."""
    both = [(list(x), list(y)) for x, y in zip(a, b) if len(x) and len(y)]
    if not both:
        return Interval(None, why="no paired values")

    def ratio(indices: Sequence[int]) -> float | None:
        top = statistic([v for i in indices for v in both[i][0]])
        bottom = statistic([v for i in indices for v in both[i][1]])
        return top / bottom if bottom else None

    value = ratio(range(len(both)))
    if len(both) < 2:
        return Interval(value, why="one conversation: an interval needs two or more")
    return _percentiles(value, [ratio(draw) for draw in _draws(len(both), seed, resamples)])


def unpaired_ratio(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]],
                   statistic: Callable[[list[float]], float] = statistics.median, seed: int = SEED,
                   resamples: int = BOOTSTRAP_RESAMPLES) -> Interval:
    """statistic(a) / statistic(b) for two runs that played different conversations: each run's
    conversations resampled on their own."""
    first, second = [list(c) for c in a if len(c)], [list(c) for c in b if len(c)]
    if not first or not second:
        return Interval(None, why="no values in one of the two")
    bottom = statistic([v for c in second for v in c])
    value = statistic([v for c in first for v in c]) / bottom if bottom else None
    if len(first) < 2 or len(second) < 2:
        return Interval(value, why="one conversation: an interval needs two or more")
    estimates = []
    for x, y in zip(_draws(len(first), seed, resamples), _draws(len(second), seed + 1, resamples)):
        under = statistic([v for i in y for v in second[i]])
        estimates.append(statistic([v for i in x for v in first[i]]) / under if under else None)
    return _percentiles(value, estimates)


def unpaired_difference(a: Interval, b: Interval) -> Interval:
    """a - b for two figures measured apart, their 95 % intervals' standard errors combined."""
    if a.value is None or b.value is None:
        return Interval(None, why="one of the two has no value")
    gap = a.value - b.value
    if a.low is None or a.high is None or b.low is None or b.high is None:
        return Interval(gap, why=a.why or b.why)
    se = math.sqrt(((a.high - a.low) / (2 * Z95)) ** 2 + ((b.high - b.low) / (2 * Z95)) ** 2)
    return Interval(gap, gap - Z95 * se, gap + Z95 * se)


def _draws(n: int, seed: int, resamples: int):
    import numpy as np

    return np.random.default_rng(seed).integers(0, n, size=(resamples, n)).tolist()


def _percentiles(value: float | None, estimates: list[float | None]) -> Interval:
    import numpy as np

    found = np.array([e for e in estimates if e is not None and math.isfinite(e)], dtype=float)
    if value is None or not len(found):
        return Interval(value, why="no finite resample")
    low, high = np.percentile(found, [2.5, 97.5])
    return Interval(value, float(low), float(high))


def p_text(p: float | None) -> str:
    """``McNemar p < 0.001`` / ``p = 0.04`` / no discordant pair."""
    if p is None:
        return "no turn where they disagree"
    return "McNemar p < 0.001" if p < 0.001 else f"McNemar p = {p:.3f}" if p < 0.01 else f"McNemar p = {p:.2f}"
