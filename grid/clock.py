"""Clock protocol: every pure component takes `now` explicitly; edges get it from a Clock."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock seconds since the epoch."""

    def monotonic(self) -> float:
        """Monotonic seconds, only meaningful within one process."""


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class SimulatedClock:
    """A clock tests and the scenario lab advance explicitly."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._mono = 0.0

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a simulated clock only moves forward")
        self._now += seconds
        self._mono += seconds
