"""The shared backoff's contract, as the supervision tree's restarts and every retry loop see it.

Bounds refused at construction, the exponent (exactly doubling from ``initial``),
the cap, the jitter range and its random source, ``reset()``, the ``at_least``
floor (a 429's Retry-After). Values only: no clock, no loop.
"""

from __future__ import annotations

import random

import pytest

from supervisor.backoff import Backoff


@pytest.mark.parametrize(("initial", "maximum"), [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0)])
def test_bounds_that_cannot_work_are_refused(initial: float, maximum: float) -> None:
    with pytest.raises(ValueError, match="invalid backoff bounds"):
        Backoff(initial, maximum)


@pytest.mark.parametrize("jitter", [(0.0, 1.0), (-0.5, 1.0), (0.6, 0.5), (1.5, 1.0)])
def test_a_jitter_range_that_cannot_work_is_refused(jitter: tuple[float, float]) -> None:
    with pytest.raises(ValueError, match="invalid jitter"):
        Backoff(1.0, 2.0, jitter=jitter)


def test_the_narrowest_valid_bounds_and_jitter_are_accepted() -> None:
    # A sub-second initial, maximum equal to initial, a one-point jitter.
    backoff = Backoff(0.5, 0.5, random.Random(1), jitter=(0.7, 0.7))
    assert [backoff.next() for _ in range(3)] == pytest.approx([0.35, 0.35, 0.35])
    assert Backoff(0.25, 1.0).next() <= 0.25


def test_delays_double_from_initial_up_to_the_cap_with_the_given_rng() -> None:
    rng = random.Random(5)
    mirror = random.Random(5)
    backoff = Backoff(0.25, 10.0, rng)
    expected = [min(10.0, 0.25 * 2.0 ** n) * mirror.uniform(0.5, 1.0) for n in range(9)]
    assert [backoff.next() for _ in range(9)] == pytest.approx(expected)
    assert backoff.failures == 9


def test_the_first_delay_is_initial_within_the_jitter_and_reset_starts_over() -> None:
    backoff = Backoff(1.0, 64.0, jitter=(1.0, 1.0))
    assert backoff.after(backoff.failures) == 1.0
    assert [backoff.next() for _ in range(4)] == [1.0, 2.0, 4.0, 8.0]
    assert backoff.after(backoff.failures) == 16.0
    backoff.reset()
    assert backoff.failures == 0
    assert backoff.after(backoff.failures) == 1.0
    assert backoff.next() == 1.0


def test_after_is_pure_and_counts_negative_failures_as_none() -> None:
    backoff = Backoff(2.0, 100.0, jitter=(1.0, 1.0))
    assert backoff.after(0) == 2.0
    assert backoff.after(-3) == 2.0
    assert backoff.after(3) == 16.0
    assert backoff.failures == 0


def test_the_exponent_stops_at_64_so_any_failure_count_is_a_number() -> None:
    # A tiny initial and a huge cap expose the exponent's own limit: past 64
    # failures the nominal delay stays initial * 2**64 (and never overflows).
    backoff = Backoff(1e-30, 1e300, jitter=(1.0, 1.0))
    assert backoff.after(64) == backoff.after(10_000) == pytest.approx(1e-30 * 2.0 ** 64)
    backoff.failures = 5_000
    assert backoff.after(backoff.failures) == pytest.approx(1e-30 * 2.0 ** 64)
    assert Backoff(1.0, 30.0, jitter=(1.0, 1.0)).after(10 ** 9) == 30.0


def test_at_least_floors_the_delay_and_never_lowers_it() -> None:
    backoff = Backoff(1.0, 64.0, jitter=(1.0, 1.0))
    assert backoff.next(at_least=5.0) == 5.0  # the server asked for more than the backoff
    assert backoff.failures == 1  # and the failure still counts
    assert backoff.next(at_least=0.5) == 2.0  # less than the backoff: the backoff
    assert backoff.next(at_least=None) == 4.0
    assert backoff.after(0, at_least=3.0) == 3.0
    assert backoff.after(5, at_least=3.0) == 32.0
    assert backoff.after(7, at_least=100.0) == 100.0  # above the cap too: the server's word
    assert backoff.failures == 3


def test_at_least_applies_after_the_jitter() -> None:
    rng, mirror = random.Random(7), random.Random(7)
    backoff = Backoff(10.0, 10.0, rng)
    jittered = 10.0 * mirror.uniform(0.5, 1.0)
    assert backoff.next(at_least=jittered + 0.001) == jittered + 0.001
    assert backoff.next(at_least=1.0) == 10.0 * mirror.uniform(0.5, 1.0)
