"""The one heartbeat-freshness rule, clock skew included.

A heartbeat is stamped with its receipt time on the log clock. It is *stale* when older than
the heartbeat timeout and *ahead* when stamped further in the future than the allowed clock
skew; a host whose last heartbeat is either is not live for the planner, the reconciler, the
router or `gridctl status`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# The one default for heartbeat freshness. A host silent for longer than this is stale: the
# planner places nothing new on it, the reconciler stops counting its open commands against
# the global budget, the router stops sending it traffic and status marks it stale.
HEARTBEAT_TIMEOUT_SECONDS = 30.0

# The one default for log clock skew: a heartbeat received this far in the future is not
# trusted (skew must not let a host look fresh for longer than the timeout).
FUTURE_SKEW_SECONDS = 5.0


class FreshnessPolicy(Protocol):
    """Anything that carries the freshness setting (planner Policy, reconciler Limits, router policy)."""

    @property
    def heartbeat_timeout_seconds(self) -> float: ...


class SkewPolicy(FreshnessPolicy, Protocol):
    """A freshness setting that also bounds future clock skew."""

    @property
    def future_skew_seconds(self) -> float: ...


@dataclass(frozen=True, slots=True)
class HeartbeatWindow:
    """The freshness setting on its own, for a caller that holds only the numbers."""

    heartbeat_timeout_seconds: float = HEARTBEAT_TIMEOUT_SECONDS
    future_skew_seconds: float = FUTURE_SKEW_SECONDS


def heartbeat_fresh(at: float | None, now: float, policy: FreshnessPolicy) -> bool:
    """True when a heartbeat received at `at` (receipt time) is not stale at `now`.

    A missing heartbeat is never fresh. A future `at` counts as fresh here; heartbeat_ahead
    is the separate skew check, so that a caller can name the two reasons apart.
    """
    return at is not None and now - at <= policy.heartbeat_timeout_seconds


def heartbeat_ahead(at: float, now: float, policy: SkewPolicy) -> bool:
    """True when a heartbeat received at `at` lies further in the future than the allowed skew."""
    return at - now > policy.future_skew_seconds


def heartbeat_live(at: float | None, now: float, policy: SkewPolicy) -> bool:
    """Fresh and not ahead: the host's last heartbeat can be trusted at `now`."""
    return at is not None and heartbeat_fresh(at, now, policy) and not heartbeat_ahead(at, now, policy)
