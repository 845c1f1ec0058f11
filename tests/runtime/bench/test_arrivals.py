"""Arrival times: Poisson and gamma gaps have mean 1/rate and the coefficient of variation the shape implies."""

from __future__ import annotations

import math

import numpy as np
import pytest

from inferfleet_runtime.bench.arrivals import arrival_offsets


@pytest.mark.parametrize("rate, burstiness", [(10.0, 1.0), (4.0, 0.25), (50.0, 4.0)])
def test_gaps_have_mean_one_over_rate_and_cv_one_over_sqrt_burstiness(rate, burstiness):
    offsets = arrival_offsets(20_000, rate, burstiness, seed=7)
    gaps = np.diff(offsets)
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.08)


def test_poisson_counts_per_second_have_variance_equal_to_the_mean():
    offsets = np.asarray(arrival_offsets(30_000, 20.0, 1.0, seed=1))
    counts = np.bincount(offsets.astype(int))[:-1]  # drop the last, partial second
    assert counts.mean() == pytest.approx(20.0, rel=0.05)
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.15)


def test_offsets_start_at_zero_do_not_decrease_and_repeat_with_a_seed():
    offsets = arrival_offsets(100, 5.0, 1.0, seed=2)
    assert offsets[0] == 0.0 and all(a <= b for a, b in zip(offsets, offsets[1:]))
    assert offsets == arrival_offsets(100, 5.0, 1.0, seed=2)
    assert offsets != arrival_offsets(100, 5.0, 1.0, seed=3)


def test_an_infinite_rate_sends_everything_at_once():
    assert arrival_offsets(5, float("inf")) == [0.0] * 5


@pytest.mark.parametrize("rate, burstiness", [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0)])
def test_refuses_non_positive_rate_or_burstiness(rate, burstiness):
    with pytest.raises(ValueError):
        arrival_offsets(3, rate, burstiness)
