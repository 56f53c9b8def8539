"""Lifecycle projection: when each host's and each model's lifecycle last changed (flap evidence).

Host transitions, by receipt time:
* the heartbeat's state differs from the previous heartbeat's (throttled, paused, unhealthy...);
* a heartbeat after a silence longer than `SILENCE_SECONDS`: the host went away (counted at the
  previous heartbeat plus that silence) and came back (counted now), two transitions.

Operator actions are not flaps: a state change an operator override caused (`gridctl host
drain|pause|quarantine`, `gridctl node ...`; the agent's ProtectionTransition says `override`) or
that releasing one caused (`resume`: a transition out of the state an override put the host in)
is not counted. The transition usually precedes the heartbeat showing its state (the change is
then expected and skipped); when the heartbeat wins the race, the change it counted is taken
back. Only the override states can be explained so (`OVERRIDE_STATES`), so a host claiming
overrides can hide flaps only between states in which it takes no new work.

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
from grid.events.host import HostHeartbeat, ProtectionTransition
from grid.fleet.freshness import HEARTBEAT_TIMEOUT_SECONDS
from grid.fleet.quarantine import HISTORY_SECONDS
from grid.projections.position import Position
from grid.projections.sharedmap import SharedMap, share_fields

# A silence of two freshness timeouts is an absence (the host was stale for a whole timeout),
# not a late heartbeat.
SILENCE_SECONDS = 2 * HEARTBEAT_TIMEOUT_SECONDS
MAX_TRANSITIONS = 512


# The states an operator override can put a host in (grid.agent.protection.OVERRIDE_STATES).
OVERRIDE_STATES: frozenset[str] = frozenset({"draining", "paused", "quarantined"})


class HostTrack(msgspec.Struct, frozen=True, kw_only=True):
    last_at: float
    last_seq: int
    state: str
    failed: tuple[str, ...] = ()  # models with a failed residency in the last heartbeat
    transitions: tuple[float, ...] = ()
    # Receipt time of the state change the latest heartbeat counted (None: it counted none):
    # an operator transition that arrives after that heartbeat takes it back.
    changed_at: float | None = None
    # The state an operator transition announced and no heartbeat has shown yet: a heartbeat
    # changing to it is the operator's doing, not the host's.
    expected: str | None = None
    # The state the latest operator override put the host in: leaving it is the release.
    operator_state: str | None = None


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
    if isinstance(event, ProtectionTransition):
        return _apply_transition(state, event)
    if not isinstance(event, HostHeartbeat):
        return state
    at = position.time
    old = state.hosts.get(event.host_id)
    if old is not None and position.seq <= old.last_seq:
        return state  # an older heartbeat never rewrites the newer one
    failed = tuple(sorted({r.model_id for r in event.residencies if r.state == "failed"}))
    changes: tuple[float, ...] = ()
    changed_at: float | None = None
    expected = old.expected if old is not None else None
    if old is not None:
        if at - old.last_at > SILENCE_SECONDS:
            changes = (old.last_at + SILENCE_SECONDS, at)
        elif event.state != old.state and event.state != old.expected:
            changes, changed_at = (at,), at
        if event.state != old.state or event.state == old.expected:
            expected = None  # shown (or superseded): an announcement covers one change only
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
        changed_at=changed_at, expected=expected, operator_state=old.operator_state if old is not None else None,
    ))
    return LifecycleState(hosts=hosts, models=models)


def operator_caused(t: ProtectionTransition, operator_state: str | None) -> bool:
    """An override put the host in `t.to_state`, or releasing one took it out of `t.from_state`."""
    if t.override:
        return t.to_state in OVERRIDE_STATES
    return operator_state is not None and t.from_state == operator_state


def _apply_transition(state: LifecycleState, t: ProtectionTransition) -> LifecycleState:
    """Note an operator-caused state change so the heartbeat showing it is not counted (or, when
    that heartbeat came first, take its count back); a host-caused one ends the operator's state."""
    old = state.hosts.get(t.host_id)
    if old is None:
        return state  # no heartbeat yet: the first one sets the baseline and counts nothing
    if not operator_caused(t, old.operator_state):
        if old.operator_state is None and old.expected is None:
            return state
        track = msgspec.structs.replace(old, operator_state=None, expected=None)
    elif old.state == t.to_state and old.changed_at is not None and old.expected is None:
        # The heartbeat showing this change was folded first and counted it (the latest count,
        # so the last one kept): take it back.
        transitions = old.transitions
        if transitions and transitions[-1] == old.changed_at:
            transitions = transitions[:-1]
        track = msgspec.structs.replace(old, transitions=transitions, changed_at=None, expected=None,
                                        operator_state=t.to_state if t.override else None)
    else:
        track = msgspec.structs.replace(old, expected=t.to_state,
                                        operator_state=t.to_state if t.override else None)
    hosts = cast(SharedMap[HostTrack], state.hosts).set(t.host_id, track)
    return LifecycleState(hosts=hosts, models=state.models)


def host_transitions(state: LifecycleState) -> dict[str, tuple[float, ...]]:
    return {h: t.transitions for h, t in sorted(state.hosts.items()) if t.transitions}


def model_transitions(state: LifecycleState) -> dict[str, tuple[float, ...]]:
    return {m: ts for m, ts in sorted(state.models.items()) if ts}
