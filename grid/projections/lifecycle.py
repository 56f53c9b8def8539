"""Lifecycle projection: when each host's and each model's lifecycle last changed (flap evidence).

Host transitions, by receipt time:
* the heartbeat's state differs from the previous heartbeat's (throttled, paused, unhealthy...);
* a heartbeat after a silence longer than `SILENCE_SECONDS`: the host went away (counted at the
  previous heartbeat plus that silence) and came back (counted now), two transitions.

Model transitions: a heartbeat reports a residency of the model `failed` where that host's
previous heartbeat did not (a crash or a failed start; drains and unloads are planned exits
and never count).

Each track keeps the transitions of the last `HISTORY_SECONDS` before its newest one (the longest
lookback grid.fleet.quarantine uses, so what is dropped never counts), and at most
`MAX_TRANSITIONS` of them (a memory bound, far above what a window can hold at any threshold
worth having). grid.fleet.quarantine decides from these, with the policy and an explicit `now`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import msgspec

from grid.events.base import Event
from grid.events.host import HostHeartbeat
from grid.fleet.freshness import HEARTBEAT_TIMEOUT_SECONDS
from grid.fleet.quarantine import HISTORY_SECONDS
from grid.projections.position import Position
from grid.projections.sharedmap import SharedMap, share_fields

# A silence of two freshness timeouts is an absence (the host was stale for a whole timeout),
# not a late heartbeat.
SILENCE_SECONDS = 2 * HEARTBEAT_TIMEOUT_SECONDS
MAX_TRANSITIONS = 512


class HostTrack(msgspec.Struct, frozen=True, kw_only=True):
    last_at: float
    last_seq: int
    state: str
    failed: tuple[str, ...] = ()  # models with a failed residency in the last heartbeat
    transitions: tuple[float, ...] = ()


class LifecycleState(msgspec.Struct, frozen=True, kw_only=True):
    # A SharedMap, as FleetState.hosts and for the same reason: a heartbeat copies one bucket.
    hosts: Mapping[str, HostTrack] = {}
    # Copied when a model newly fails, which is rare and bounded by the catalog, not the fleet.
    models: dict[str, tuple[float, ...]] = {}

    def __post_init__(self) -> None:
        share_fields(self, "hosts")


def initial() -> LifecycleState:
    return LifecycleState()


def _bounded(times: tuple[float, ...], at: float) -> tuple[float, ...]:
    """The transitions a quarantine decision at or after `at` can still count."""
    start = at - HISTORY_SECONDS
    first = next((i for i, t in enumerate(times) if t > start), len(times))
    return times[max(first, len(times) - MAX_TRANSITIONS):]


def apply(state: LifecycleState, event: Event, position: Position) -> LifecycleState:
    if not isinstance(event, HostHeartbeat):
        return state
    at = position.time
    old = state.hosts.get(event.host_id)
    if old is not None and position.seq <= old.last_seq:
        return state  # an older heartbeat never rewrites the newer one
    failed = tuple(sorted({r.model_id for r in event.residencies if r.state == "failed"}))
    changes: tuple[float, ...] = ()
    if old is not None:
        if at - old.last_at > SILENCE_SECONDS:
            changes = (old.last_at + SILENCE_SECONDS, at)
        elif event.state != old.state:
            changes = (at,)
    models = state.models
    newly_failed = [m for m in failed if old is None or m not in old.failed]
    if newly_failed:
        models = dict(models)
        for m in newly_failed:
            models[m] = _bounded(models.get(m, ()) + (at,), at)
    transitions = old.transitions if old is not None else ()
    if changes or (transitions and transitions[0] <= at - HISTORY_SECONDS):
        transitions = _bounded(transitions + changes, at)
    hosts = cast(SharedMap[HostTrack], state.hosts).set(event.host_id, HostTrack(
        last_at=at, last_seq=position.seq, state=event.state, failed=failed, transitions=transitions,
    ))
    return LifecycleState(hosts=hosts, models=models)


def host_transitions(state: LifecycleState) -> dict[str, tuple[float, ...]]:
    return {h: t.transitions for h, t in sorted(state.hosts.items()) if t.transitions}


def model_transitions(state: LifecycleState) -> dict[str, tuple[float, ...]]:
    return {m: ts for m, ts in sorted(state.models.items()) if ts}
