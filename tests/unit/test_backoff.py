"""Backoff: exponential waits with a cap, and jitter only from the random source given."""

from __future__ import annotations

import itertools
import random

import pytest

from grid.backoff import Backoff


def test_waits_double_up_to_the_cap_and_stay_there() -> None:
    policy = Backoff(first=0.25, cap=5.0)
    assert [policy.delay(n) for n in range(1, 9)] == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    assert list(itertools.islice(policy.delays(), 8)) == [policy.delay(n) for n in range(1, 9)]


def test_a_long_outage_stays_at_the_cap() -> None:
    # factor ** failures overflows a float long before a caller stops counting.
    assert Backoff(first=1.0, cap=30.0).delay(10_000) == 30.0
    assert Backoff(first=1.0, cap=30.0, factor=10).delay(10**9) == 30.0


def test_factor_one_is_a_fixed_wait() -> None:
    assert list(itertools.islice(Backoff(first=0.5, cap=0.5, factor=1).delays(), 3)) == [0.5, 0.5, 0.5]


def test_each_iterator_starts_the_schedule_over() -> None:
    policy = Backoff(first=1.0, cap=30.0)
    first = policy.delays()
    assert [next(first), next(first), next(first)] == [1.0, 2.0, 4.0]
    assert next(policy.delays()) == 1.0


def test_jitter_only_shortens_a_wait_by_at_most_its_share() -> None:
    policy = Backoff(first=1.0, cap=8.0, jitter=0.5)
    assert policy.delay(4, lambda: 0.0) == 8.0
    assert policy.delay(4, lambda: 0.5) == 6.0
    assert policy.delay(4, lambda: 0.999) == pytest.approx(4.004)
    for wait, plain in zip(itertools.islice(policy.delays(random.Random(1).random), 50),
                           itertools.islice(Backoff(first=1.0, cap=8.0).delays(), 50)):
        assert plain / 2 < wait <= plain


def test_jitter_from_the_same_seed_repeats() -> None:
    policy = Backoff(first=0.1, cap=10.0, jitter=1.0)
    runs = [list(itertools.islice(policy.delays(random.Random(7).random), 20)) for _ in range(2)]
    assert runs[0] == runs[1]


def test_jitter_needs_a_random_source_and_no_jitter_draws_none() -> None:
    with pytest.raises(ValueError, match="random source"):
        Backoff(first=1.0, cap=2.0, jitter=0.1).delays()
    with pytest.raises(ValueError, match="random source"):
        Backoff(first=1.0, cap=2.0, jitter=0.1).delay(1)

    def must_not_draw() -> float:
        raise AssertionError("a policy without jitter drew a random number")

    assert Backoff(first=1.0, cap=2.0).delay(3, must_not_draw) == 2.0


@pytest.mark.parametrize("kwargs", [
    {"first": 0.0, "cap": 1.0},
    {"first": -1.0, "cap": 1.0},
    {"first": 2.0, "cap": 1.0},
    {"first": 1.0, "cap": 2.0, "factor": 0.5},
    {"first": 1.0, "cap": 2.0, "jitter": 1.5},
    {"first": 1.0, "cap": 2.0, "jitter": -0.1},
    {"first": float("nan"), "cap": 2.0},
])
def test_a_policy_that_makes_no_sense_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(**kwargs)


def test_a_wait_follows_at_least_one_failure() -> None:
    with pytest.raises(ValueError):
        Backoff(first=1.0, cap=2.0).delay(0)
