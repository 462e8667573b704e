"""A verdict on a paired ratio stands only when its median's interval lies on one side
of the target; the interval holds the median as often as it says (checked by drawing)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hecate_dev.bench.interval import median_interval


def test_the_secure_pairs_that_read_met_on_their_median_are_undecided() -> None:
    # The pairs behind "locked-down >= 0.95x open: met" at a median of 0.960.
    pairs = [0.930, 0.941, 0.955, 0.958, 0.962, 0.978, 1.04, 1.155]
    interval = median_interval(pairs)
    assert (interval.low, interval.high) == (0.941, 1.04)
    assert interval.confidence == pytest.approx(1 - 2 * 9 / 256)  # 93 %
    assert interval.verdict_at_least(0.95) == "undecided"
    assert interval.verdict_at_least(0.90) is True
    assert interval.verdict_at_least(1.05) is False
    assert interval.verdict_at_most(0.95) == "undecided"
    assert interval.verdict_at_most(1.05) is True
    assert interval.verdict_at_most(0.90) is False


def test_three_rounds_give_their_range_at_the_confidence_it_has() -> None:
    interval = median_interval([0.993, 0.751, 0.706])
    assert (interval.low, interval.high, interval.confidence) == (0.706, 0.993, 0.75)
    assert interval.verdict_at_least(0.8) == "undecided"
    assert median_interval([0.30, 0.31, 0.29]).verdict_at_least(0.35) is False


@given(st.lists(st.floats(0.01, 100.0), min_size=1, max_size=40))
def test_the_interval_holds_the_sample_median(values: list[float]) -> None:
    interval = median_interval(values)
    ordered = sorted(values)
    middle = (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) / 2
    assert interval.low <= middle <= interval.high
    assert 0 < interval.confidence < 1 or len(values) == 1


def test_it_holds_the_true_median_at_least_as_often_as_it_says() -> None:
    rng = random.Random(7)
    for n in (5, 8, 12):
        interval_conf = median_interval([0.0] * n).confidence
        held = 0
        draws = 2000
        for _ in range(draws):
            sample = [rng.lognormvariate(0.0, 0.1) for _ in range(n)]  # median 1.0
            i = median_interval(sample)
            held += i.low <= 1.0 <= i.high
        assert held / draws >= interval_conf - 0.03, (n, held / draws, interval_conf)
