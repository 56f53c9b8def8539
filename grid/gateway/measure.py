"""Private proxy measurements: per engine, per model (and artifact revision) EWMAs.

End-to-end latency and completion-token throughput each keep their own sample count and
update time: confidence ramps to full over eight samples and freshness decays against that
metric's own timestamp, so a stream without a token count refreshes latency without making an
old token rate look fresh. A different artifact sha for the same route resets both estimators
(never blend incompatible revisions). These values are never exposed by discovery and never
overwritten by heartbeats. Every method takes `now` explicitly.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

FULL_CONFIDENCE_SAMPLES = 8
MIN_ALPHA = 0.2
# Full weight while younger than this; linear decay to nothing at EXPIRY_SECONDS.
FRESH_SECONDS = 120.0
EXPIRY_SECONDS = 1800.0
MAX_ROUTES = 4096
MAX_LATENCY_SECONDS = 3600.0


@dataclass(slots=True)
class Ewma:
    value: float = 0.0
    samples: int = 0
    updated_at: float = 0.0

    def update(self, x: float, now: float) -> None:
        self.samples += 1
        alpha = max(MIN_ALPHA, 1.0 / self.samples)
        self.value += alpha * (x - self.value)
        self.updated_at = now

    def weight(self, now: float) -> float:
        """Confidence x freshness in [0, 1]; 0 means no usable evidence."""
        if self.samples <= 0:
            return 0.0
        confidence = min(1.0, self.samples / FULL_CONFIDENCE_SAMPLES)
        age = max(0.0, now - self.updated_at)
        if age <= FRESH_SECONDS:
            return confidence
        if age >= EXPIRY_SECONDS:
            return 0.0
        return confidence * (1.0 - (age - FRESH_SECONDS) / (EXPIRY_SECONDS - FRESH_SECONDS))


@dataclass(slots=True)
class RouteMeasurement:
    artifact_sha256: str | None
    latency: Ewma = field(default_factory=Ewma)
    tokens_per_second: Ewma = field(default_factory=Ewma)


class Measurements:
    """Bounded map route -> RouteMeasurement (the least recently updated route is evicted)."""

    def __init__(self, max_routes: int = MAX_ROUTES) -> None:
        self._routes: dict[Hashable, RouteMeasurement] = {}
        self._max = max_routes

    def __len__(self) -> int:
        return len(self._routes)

    def get(self, key: Hashable) -> RouteMeasurement | None:
        return self._routes.get(key)

    def view(self) -> dict[Hashable, RouteMeasurement]:
        return self._routes

    def record_response(
        self,
        key: Hashable,
        artifact_sha256: str | None,
        latency_seconds: float,
        completion_tokens: int | None,
        now: float,
    ) -> None:
        """One successful response. Invalid values are ignored rather than poisoning routing."""
        if not (0.0 < latency_seconds <= MAX_LATENCY_SECONDS):
            return
        m = self._routes.get(key)
        if m is None or m.artifact_sha256 != artifact_sha256:
            # New route or a new artifact revision: start over instead of blending.
            if m is None and len(self._routes) >= self._max:
                oldest = min(self._routes, key=lambda k: self._routes[k].latency.updated_at)
                del self._routes[oldest]
            m = RouteMeasurement(artifact_sha256)
            self._routes[key] = m
        m.latency.update(latency_seconds, now)
        if completion_tokens is not None and completion_tokens > 0:
            m.tokens_per_second.update(completion_tokens / latency_seconds, now)
