"""The one statistics module against textbook values, and against planted effects: a real
difference is found, and a null one (the same arm twice) is called different about 5 % of the time."""

from __future__ import annotations

import random
import statistics

import pytest

from localchat.intervals import bootstrap, cluster_mean, mcnemar_p, paired_difference, paired_ratio


def test_an_exact_mcnemar_p_value_as_the_textbooks_give_it():
    pairs = [(True, False)] * 10 + [(False, True)] * 2 + [(True, True)] * 30  # 10 vs 2 discordant
    assert mcnemar_p(pairs) == pytest.approx(158 / 4096)  # 2·(C(12,0)+C(12,1)+C(12,2))/2¹² = 0.0386
    assert mcnemar_p([(True, True), (False, False)]) is None  # nothing to test
    assert mcnemar_p([(True, False)] * 3 + [(False, True)] * 3) == 1.0


def test_one_turn_a_conversation_gives_the_textbook_intervals():
    accuracy = cluster_mean([[v] for v in [1, 0, 1, 1, 0, 1, 1, 1, 0, 1]], share=True)  # 7 of 10
    assert accuracy.value == pytest.approx(0.7)
    assert (accuracy.low, accuracy.high) == pytest.approx((0.3968, 0.8922), abs=1e-4)  # Wilson, 7/10
    perfect = cluster_mean([[1]] * 69, share=True)
    assert perfect.high == 1.0 and perfect.low == pytest.approx(69 / (69 + 1.959963984540054 ** 2))  # not a point
    values = [2.0, 3.5, 1.0, 4.0, 2.5, 3.0]
    mean = cluster_mean([[v] for v in values])
    half = 1.959963984540054 * statistics.stdev(values) / len(values) ** 0.5  # s/√n, the textbook mean's
    assert (mean.low, mean.high) == pytest.approx((statistics.fmean(values) - half, statistics.fmean(values) + half))


def test_turns_that_share_a_conversation_widen_the_interval():
    alike = [[1] * 5, [0] * 5, [1] * 5, [0] * 5, [1] * 5, [1] * 5]  # each conversation all right or all wrong
    spread = [[1, 0, 1, 1, 0], [1, 1, 0, 1, 0], [0, 1, 1, 0, 1], [1, 0, 1, 0, 1], [1, 1, 0, 0, 1], [0, 1, 1, 1, 0]]
    wide, narrow = cluster_mean(alike, share=True), cluster_mean(spread, share=True)
    assert wide.high - wide.low > 1.5 * (narrow.high - narrow.low)  # six conversations, not thirty turns
    single = cluster_mean([[1, 0, 1]], share=True)
    assert single.value == pytest.approx(2 / 3) and not single.known and "two or more" in single.why


def test_a_bootstrap_is_reproducible_and_near_the_normal_theory_width_of_a_median():
    rng = random.Random(7)
    values = [[rng.gauss(0, 1)] for _ in range(400)]
    first, second = bootstrap(values), bootstrap(values)
    assert first == second and first.low < first.value < first.high
    width = 2 * 1.96 * 1.2533 / 400 ** 0.5  # the median's asymptotic standard error, 1.2533·σ/√n
    assert first.high - first.low == pytest.approx(width, rel=0.3)


def test_a_paired_ratio_resamples_the_same_conversations_for_both_arms():
    slow = [[2.0, 2.2, 2.1], [1.9, 2.0], [2.3, 2.1, 2.2], [2.0, 2.0]]
    fast = [[1.0, 1.1, 1.05], [0.95, 1.0], [1.15, 1.05, 1.1], [1.0, 1.0]]
    ratio = paired_ratio(slow, fast)
    assert ratio.value == pytest.approx(2.0, rel=0.05) and 1.8 < ratio.low <= ratio.value <= ratio.high < 2.2
    assert not ratio.spans(1.0)


def simulated(rng: random.Random, p_a: float, p_b: float, conversations: int = 20, turns: int = 5) -> list:
    """Two arms on the same conversations; a conversation's difficulty moves both arms alike."""
    pairs = []
    for _ in range(conversations):
        shift = rng.gauss(0, 0.15)
        pa, pb = (min(1, max(0, p + shift)) for p in (p_a, p_b))
        pairs.append([(float(rng.random() < pa), float(rng.random() < pb)) for _ in range(turns)])
    return pairs


def test_a_planted_difference_is_found_and_a_null_one_rarely_is():
    rng = random.Random(52)
    found = sum(not paired_difference(simulated(rng, 0.9, 0.5)).spans(0.0) for _ in range(50))
    assert found >= 48
    null_runs = 300
    called = sum(not paired_difference(simulated(rng, 0.7, 0.7)).spans(0.0) for _ in range(null_runs))
    assert called / null_runs <= 0.08, called
