"""The agreement benchmark's arithmetic: the paired ratio interval and its verdict."""
from __future__ import annotations

import math

import pytest

from benchmarks.agreement import paired_ratio_ci, verdict


def test_shared_noise_cancels_in_pairs():
    # both clients see the same swings (load on the machine): the ratio is exact, the interval a point
    load = [1.0, 0.5, 2.0, 0.8, 1.3]
    a = [100 * x for x in load]
    b = [50 * x for x in load]
    ratio, lo, hi = paired_ratio_ci(a, b)
    assert ratio == pytest.approx(2.0)
    assert lo == pytest.approx(2.0) and hi == pytest.approx(2.0)


def test_interval_is_the_paired_delta_method():
    a, b = [10.0, 12.0, 11.0, 13.0], [10.0, 11.0, 12.0, 11.0]
    ma, mb = sum(a) / 4, sum(b) / 4
    d = [x / ma - y / mb for x, y in zip(a, b)]
    md = sum(d) / 4
    se = math.sqrt(sum((x - md) ** 2 for x in d) / 3) / 2
    ratio, lo, hi = paired_ratio_ci(a, b)
    assert ratio == pytest.approx(ma / mb)
    assert lo == pytest.approx(ratio * math.exp(-3.182446305284263 * se))  # t(0.975, 3 df)
    assert hi == pytest.approx(ratio * math.exp(3.182446305284263 * se))


def test_degenerate_and_unequal_samples():
    assert paired_ratio_ci([1.0], [2.0]) == (0.5, None, None)
    assert paired_ratio_ci([], []) == (None, None, None)
    with pytest.raises(ValueError):
        paired_ratio_ci([1.0, 2.0], [1.0])


@pytest.mark.parametrize("lo, hi, word", [(0.99, 1.01, "agree"), (0.97, 1.01, "unresolved"),
                                          (1.03, 1.10, "differ"), (0.90, 0.97, "differ"),
                                          (None, None, "unresolved")])
def test_verdict(lo, hi, word):
    assert verdict(lo, hi) == word
