"""Exponential backoff: the waits between attempts at something that keeps failing.

A policy is a value, `Backoff`: the wait after the first failure, the factor each further
failure multiplies it by, the cap no wait exceeds, and how much jitter. `delay(failures)` is the
wait after that many consecutive failures, a pure function of its arguments; `delays()` yields
the waits after the first, second, third ... failure. Jitter draws from a random source the
caller passes (e.g. `random.Random(seed).random`), so a test or a simulation sees the same waits
every run; a policy without jitter draws nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

# A source of uniform draws in [0, 1), such as random.Random(seed).random.
Uniform = Callable[[], float]


@dataclass(frozen=True)
class Backoff:
    """Waits of `first`, `first * factor`, `first * factor**2` ... seconds, at most `cap`."""

    first: float
    cap: float
    factor: float = 2.0
    # Up to this share (0..1) of each wait is taken off at random. Jitter only ever shortens a
    # wait, so `cap` stays the longest wait and the unjittered schedule an upper bound (the time
    # a caller spends before giving up stays bounded by the same sum).
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if not self.first > 0:
            raise ValueError(f"first wait must be positive, not {self.first}")
        if not self.cap >= self.first:
            raise ValueError(f"cap {self.cap} is below the first wait {self.first}")
        if not self.factor >= 1:
            raise ValueError(f"factor must be at least 1 (waits never shrink), not {self.factor}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter is a share of the wait, 0..1, not {self.jitter}")

    def delay(self, failures: int, uniform: Uniform | None = None) -> float:
        """Seconds to wait after `failures` consecutive failures (1: the first). `uniform` is
        required when the policy has jitter, and unused when it has none."""
        if failures < 1:
            raise ValueError(f"a wait follows at least one failure, not {failures}")
        self._check_source(uniform)
        try:
            # A float power: an int factor would build an ever larger integer before the cap.
            grown = self.first * float(self.factor) ** (failures - 1)
        except OverflowError:  # a long outage: the wait passed the cap long ago
            grown = self.cap
        wait = min(self.cap, grown)
        if self.jitter and uniform is not None:
            wait *= 1.0 - self.jitter * uniform()
        return wait

    def delays(self, uniform: Uniform | None = None) -> Iterator[float]:
        """The waits after the first, second, ... failure, without end (start a new iterator
        after a success). A missing random source is refused here, not at the first wait."""
        self._check_source(uniform)
        return self._delays(uniform)

    def _delays(self, uniform: Uniform | None) -> Iterator[float]:
        failures = 1
        while True:
            yield self.delay(failures, uniform)
            failures += 1

    def _check_source(self, uniform: Uniform | None) -> None:
        if self.jitter and uniform is None:
            raise ValueError("a backoff with jitter needs an explicit random source (uniform)")
