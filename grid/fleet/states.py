"""The named sets and orders of host and residency states.

Host and residency states themselves are the Literals in :mod:`grid.events.host`. Every module
that asks "does this host admit work", "does this residency hold memory" or "does it serve"
asks one of these sets, so that a host the planner considers admitting is the host the router
sends traffic to and the agent fences by.
"""

from __future__ import annotations

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

# Residency states with an engine process, started or still stopping. The planner reserves a
# process's memory and model slot from the moment the load starts, so `loading` counts.
PROCESS_STATES: frozenset[str] = frozenset({"loading", "warming", "ready", "draining", "unloading", "failed"})

# Residency states whose memory is measured as held: what a heartbeat reports per residency,
# what the reconciler, status and the simulated host subtract from free memory, and what the
# agent counts as committed before a new load. A `loading` residency is not here: its engine
# has not finished mapping the model, so it reports 0 MiB, and its memory is the load
# command's to account for until it warms.
HOLDS_MEMORY_STATES: frozenset[str] = PROCESS_STATES - {"loading"}

# Residency states that answer routed requests (a draining one finishes what it has): they
# report an endpoint, concurrency and a loaded age.
SERVING_STATES: frozenset[str] = frozenset({"ready", "draining"})

# Managed residency states that stand for a replica of their model (loading toward it, serving
# or on the way out): a claim of one the controller never commanded there is not supply.
REPLICA_STATES: frozenset[str] = PROCESS_STATES - {"failed"}

# Residency states the planner keeps as healthy incumbents: serving now or on the way to it.
INCUMBENT_STATES: frozenset[str] = frozenset({"ready", "warming", "loading"})

# Residency states whose "this replica is up" claim is judged against the commands that
# should have produced it (what status and metrics count as claims).
CLAIM_STATES: frozenset[str] = frozenset({"ready", "warming"})

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

assert set(ADMITTING_HOST_STATES) <= set(HOST_STATES)
assert set(EVACUATING_HOST_STATES) <= set(HOST_STATES)
assert set(RESIDENCY_STATE_RANK) == set(RESIDENCY_STATES)
assert PROCESS_STATES <= set(RESIDENCY_STATES)
