"""One vocabulary for fleet state, shared by the planner, reconciler, router, agent and status.

Host and residency states themselves are the Literals in :mod:`grid.events.host`. This module
names the sets and orders built from them, and the single heartbeat-freshness rule, so that a
host the planner considers live is the host the router sends traffic to and the host `gridctl
status` shows as fresh.
"""

from __future__ import annotations

from typing import Protocol

from grid.events.host import HOST_STATES, RESIDENCY_STATES

# Host states that admit new work: new placements (planner, reconciler), routed requests
# (gateway) and admission commands (agent fencing). "throttled" admits at a reduced share.
ADMITTING_HOST_STATES: frozenset[str] = frozenset({"accepting", "throttled"})

# An operator drain is a make-before-break evacuation: the host takes no new placement, but a
# residency it already serves keeps taking routed requests (after every admitting host) until
# the reconciler drains it, which it does once the replacement is ready or the evacuation
# deadline (reconciler Limits.evacuation_deadline_seconds) has passed. Paused, unhealthy and
# quarantined hosts stop traffic at once.
EVACUATING_HOST_STATES: frozenset[str] = frozenset({"draining"})
ROUTABLE_HOST_STATES: frozenset[str] = ADMITTING_HOST_STATES | EVACUATING_HOST_STATES

# How far a residency has progressed toward serving; a larger rank is more useful. When a
# host reports several residencies of one model the highest rank describes it, and placement
# prefers incumbents in this order (ready before warming before loading).
RESIDENCY_STATE_RANK: dict[str, int] = {
    "ready": 7,
    "warming": 6,
    "loading": 5,
    "draining": 4,
    "unloading": 3,
    "failed": 2,
    "cached": 1,
}

# The one default for heartbeat freshness. A host silent for longer than this is stale: the
# planner places nothing new on it, the reconciler stops counting its open commands against
# the global budget, the router stops sending it traffic and status marks it stale.
HEARTBEAT_TIMEOUT_SECONDS = 30.0

assert set(ADMITTING_HOST_STATES) <= set(HOST_STATES)
assert set(EVACUATING_HOST_STATES) <= set(HOST_STATES)
assert set(RESIDENCY_STATE_RANK) == set(RESIDENCY_STATES)


class FreshnessPolicy(Protocol):
    """Anything that carries the freshness setting (planner Policy, reconciler Limits, router policy)."""

    @property
    def heartbeat_timeout_seconds(self) -> float: ...


def heartbeat_fresh(at: float | None, now: float, policy: FreshnessPolicy) -> bool:
    """True when a heartbeat received at `at` (receipt time) is still fresh at `now`.

    A missing heartbeat is never fresh. Future-skew checks are separate (the planner rejects a
    heartbeat from the future with its own reason); here a future `at` counts as fresh.
    """
    return at is not None and now - at <= policy.heartbeat_timeout_seconds
