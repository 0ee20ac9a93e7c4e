"""Open-loop schedules: a function of the cell and the repetition only (every config meets the same arrivals), at
the rate the cell names, and sent each when due whether or not the earlier requests have finished."""
from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from agent import arrivals


def cell(rate: Any, n: int = 8, arrival: str = "poisson", seed: int = 0) -> dict[str, Any]:
    return {"workload": "fib", "max_tokens": 64, "context_tokens": 0, "concurrency": 0, "request_rate": rate,
            "arrival": arrival, "requests": n, "seed": seed}


@pytest.mark.parametrize("rate", [0.25, 2, 16.5, 1000])
@pytest.mark.parametrize("n", [2, 3, 8, 50])
def test_poisson_arrivals_span_the_rate_they_name(rate: float, n: int) -> None:
    """Conditioned on the count: first at 0, increasing, the last at (n - 1)/rate, so (n - 1) over the span is the
    rate; the gaps are not all equal (random arrivals, not a metronome)."""
    got = arrivals.schedule(cell(rate, n), 0)
    assert len(got) == n and got[0] == 0.0
    assert all(b >= a for a, b in zip(got, got[1:]))
    assert got[-1] == pytest.approx((n - 1) / rate)
    assert arrivals.achieved_rate(got) == pytest.approx(rate)
    if n > 2:
        gaps = [b - a for a, b in zip(got, got[1:])]
        assert max(gaps) > 1.2 * min(gaps)


def test_a_schedule_depends_on_the_cell_and_repetition_only() -> None:
    """The same for every call (every config of a phase), other for another repetition, seed, rate or count; the
    workload does not enter (one rate, one schedule, whatever is asked)."""
    base = arrivals.schedule(cell(4), 0)
    assert arrivals.schedule(cell(4), 0) == base
    assert arrivals.schedule({**cell(4), "workload": "json"}, 0) == base
    for other in (arrivals.schedule(cell(4), 1), arrivals.schedule(cell(4, seed=1), 0),
                  arrivals.schedule(cell(5), 0), arrivals.schedule(cell(4, 9), 0)[:8]):
        assert other != base


def test_constant_all_at_once_and_a_single_request() -> None:
    assert arrivals.schedule(cell(4, 5, "constant"), 3) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert arrivals.schedule(cell("inf", 6), 0) == [0.0] * 6
    assert arrivals.schedule(cell(2.5, 1), 0) == [0.0]
    assert arrivals.achieved_rate([0.0]) is None and arrivals.achieved_rate([1.0, 1.0]) == float("inf")


def test_each_request_is_sent_when_due_without_waiting_for_the_earlier_ones() -> None:
    """Three calls due 0, 0.05 and 0.1 s apart, each held until all three are in flight (a barrier): sending
    them one after another would never get there. Each starts at or after its due time, in schedule order."""
    gate = threading.Barrier(3, timeout=10)
    started: dict[int, float] = {}

    def one(i: int, due: float) -> dict[str, Any]:
        started[i] = time.perf_counter()
        gate.wait()  # raises BrokenBarrierError after 10 s unless all three are in flight at once
        return {"slot": i, "due": due}

    rows, seconds = arrivals.send([0.0, 0.05, 0.1], one)
    assert [r["slot"] for r in rows] == [0, 1, 2]
    assert all(started[r["slot"]] >= r["due"] - 1e-6 for r in rows)
    assert rows[1]["due"] - rows[0]["due"] == pytest.approx(0.05) and seconds >= 0.1
