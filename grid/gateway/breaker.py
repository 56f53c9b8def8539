"""Private per-engine, per-model circuit breaker over outcomes the proxy observes.

* a 429 opens a one-second cooldown at once;
* two consecutive transport or 5xx failures open it, with exponential backoff
  (1 s, 2 s, 4 s, ... capped at 30 s) that keeps growing while the failure streak lasts;
* an expired circuit admits exactly one half-open probe; any 2xx resets everything;
* caller-caused answers are neutral (they only release a probe): a 4xx other than 401/403/429,
  and 501, which an engine gives for an endpoint it does not serve (embeddings sent to a
  chat-only model). One client asking for the wrong thing must never take a model offline
  for everyone else.

State lives in memory only: it never changes discovery inventory, grants no lifecycle
authority and is not persisted across a restart. Nothing here replays a request: a failure
only redirects the requests that come after it. Every method takes `now` explicitly.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

RATE_LIMIT_COOLDOWN_SECONDS = 1.0
FAILURES_TO_OPEN = 2
BASE_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 30.0
# A probe whose outcome never arrives (client vanished before headers) frees its slot after this.
PROBE_TIMEOUT_SECONDS = 60.0

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"

OUTCOME_SUCCESS = "success"
OUTCOME_RATE_LIMITED = "rate_limited"
OUTCOME_FAILURE = "failure"  # transport error or 5xx
OUTCOME_NEUTRAL = "neutral"  # caller 4xx or 501, cancelled before an answer

# Server-side statuses that the request caused: the engine does not implement what was asked.
CALLER_CAUSED_5XX = frozenset({501})


def classify_status(status: int) -> str:
    """Breaker outcome of an upstream status.

    401/403 from an engine are route failures, not caller mistakes: the gateway strips client
    credentials and sends its own engine key, so a refusal means the route itself is broken.
    """
    if 200 <= status < 300:
        return OUTCOME_SUCCESS
    if status == 429:
        return OUTCOME_RATE_LIMITED
    if status in CALLER_CAUSED_5XX:
        return OUTCOME_NEUTRAL
    if status >= 500 or status in (401, 403):
        return OUTCOME_FAILURE
    return OUTCOME_NEUTRAL


@dataclass(slots=True)
class Circuit:
    failures: int = 0  # consecutive transport/5xx failures
    opens: int = 0  # consecutive failure-opens (drives the backoff exponent)
    open_until: float = 0.0
    probe_started: float | None = None  # set while a half-open probe is in flight
    half_open: bool = False  # the open period expired and no success has closed it yet

    def state(self, now: float) -> str:
        if now < self.open_until:
            return OPEN
        if self.half_open:
            return HALF_OPEN
        return CLOSED


def backoff_seconds(opens: int) -> float:
    return min(MAX_BACKOFF_SECONDS, BASE_BACKOFF_SECONDS * (2.0 ** max(0, opens - 1)))


class BreakerBoard:
    """Circuits keyed by route (engine + model). Only non-closed circuits are kept."""

    def __init__(self) -> None:
        self._circuits: dict[Hashable, Circuit] = {}

    def __len__(self) -> int:
        return len(self._circuits)

    def state(self, key: Hashable, now: float) -> str:
        c = self._circuits.get(key)
        return CLOSED if c is None else c.state(now)

    def allows(self, key: Hashable, now: float) -> bool:
        c = self._circuits.get(key)
        if c is None:
            return True
        if now < c.open_until:
            return False
        if c.half_open and c.probe_started is not None and now - c.probe_started < PROBE_TIMEOUT_SECONDS:
            return False  # one probe at a time
        return True

    def blocked(self, now: float) -> frozenset[Hashable]:
        """Routes that may not take a new request now (open, or half-open with a probe out)."""
        if not self._circuits:
            return frozenset()
        return frozenset(k for k in self._circuits if not self.allows(k, now))

    def retry_after(self, keys: list[Hashable], now: float) -> float:
        """Seconds until the first of `keys` admits a request again (at least 1)."""
        waits = []
        for k in keys:
            c = self._circuits.get(k)
            if c is None:
                return 1.0
            waits.append(max(0.0, c.open_until - now))
        return max(1.0, min(waits) if waits else 1.0)

    def acquire(self, key: Hashable, now: float) -> bool:
        """Called when a request is sent on `key`. Returns True when it is the half-open probe."""
        c = self._circuits.get(key)
        if c is None or now < c.open_until:
            return False
        if c.open_until > 0.0 and not c.half_open:
            c.half_open = True  # the cooldown expired: this request is the probe
        if c.half_open:
            c.probe_started = now
            return True
        return False

    def record(self, key: Hashable, outcome: str, now: float) -> None:
        if outcome == OUTCOME_SUCCESS:
            self._circuits.pop(key, None)
            return
        c = self._circuits.get(key)
        if outcome == OUTCOME_NEUTRAL:
            if c is not None:
                c.probe_started = None
                if c.failures == 0 and c.open_until <= now and not c.half_open:
                    self._circuits.pop(key, None)
            return
        if c is None:
            c = self._circuits[key] = Circuit()
        c.probe_started = None
        if outcome == OUTCOME_RATE_LIMITED:
            c.open_until = max(c.open_until, now + RATE_LIMIT_COOLDOWN_SECONDS)
            c.half_open = False
            return
        # transport failure or 5xx
        c.failures += 1
        if c.failures >= FAILURES_TO_OPEN or c.half_open:
            c.opens += 1
            c.open_until = max(c.open_until, now + backoff_seconds(c.opens))
            c.half_open = False

    def describe(self, now: float) -> list[dict[str, object]]:
        out = []
        for key in sorted(self._circuits, key=repr):
            c = self._circuits[key]
            out.append({
                "route": list(key) if isinstance(key, tuple) else key,
                "state": c.state(now),
                "failures": c.failures,
                "opens": c.opens,
                "retry_in_seconds": round(max(0.0, c.open_until - now), 3),
            })
        return out
