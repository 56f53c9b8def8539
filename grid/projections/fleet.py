"""Fleet projection: registrations, latest heartbeat per host, protection, operator overrides.

Freshness is judged by receipt time (the log's timestamp), never by the sender's clock.
`snapshots(state, now)` turns the fold into the planner's HostView values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import msgspec

from grid.events.base import Event
from grid.events.control import CredentialRevoked, HostOverride
from grid.events.host import (
    QUALIFICATION_PASSED,
    HostHeartbeat,
    HostRegistered,
    HostResources,
    ProtectionTransition,
    QualificationRecorded,
)
from grid.fleet.views import HostView, QualificationView, ResidencyView
from grid.projections.position import Position
from grid.projections.sharedmap import SharedMap, share_fields

# Operator override states outrank an accepting/throttled host but never relax a local fence.
_FENCE_RANK = {"accepting": 0, "throttled": 1, "draining": 2, "paused": 3, "unhealthy": 4, "quarantined": 5}


class OverrideRecord(msgspec.Struct, frozen=True):
    state: str
    reason: str
    set_at: float
    expires_at: float | None = None


class HostRecord(msgspec.Struct, frozen=True, kw_only=True):
    host_id: str
    hostname: str = ""
    resources: HostResources | None = None
    actuator_capabilities: tuple[str, ...] = ()
    registered_at: float | None = None
    heartbeat: HostHeartbeat | None = None
    heartbeat_at: float | None = None
    heartbeat_seq: int = 0
    protection_state: str | None = None
    protection_reason: str = ""
    protection_at: float | None = None
    override: OverrideRecord | None = None
    # The latest qualification per (runtime, model) this host recorded for itself.
    qualifications: tuple[QualificationView, ...] = ()
    # When (receipt time) the operator revoked this host's credentials (`gridctl node revoke`, a
    # CredentialRevoked on the log), and why; cleared by a later registration, which only a new
    # credential can sign (the folds reject what the revoked keys sign). Absent from snapshots
    # written before: None.
    revoked_at: float | None = None
    revoked_reason: str = ""


class FleetState(msgspec.Struct, frozen=True, kw_only=True):
    # A SharedMap, sorted when iterated: a heartbeat's fold copies one bucket of it, not the
    # fleet, and the state it replaces stays as it was (a tick may hold it). Encoded as a plain
    # dict; given one (decoded from a snapshot, or built by hand), it is converted here.
    hosts: Mapping[str, HostRecord] = {}

    def __post_init__(self) -> None:
        share_fields(self, "hosts")


def initial() -> FleetState:
    return FleetState()


def _put(state: FleetState, record: HostRecord) -> FleetState:
    return FleetState(hosts=cast(SharedMap[HostRecord], state.hosts).set(record.host_id, record))


def apply(state: FleetState, event: Event, position: Position) -> FleetState:
    match event:
        case HostHeartbeat():
            old = state.hosts.get(event.host_id) or HostRecord(host_id=event.host_id)
            if position.seq <= old.heartbeat_seq:
                return state  # an older heartbeat never overwrites a newer one
            return _put(
                state,
                msgspec.structs.replace(
                    old,
                    heartbeat=event,
                    heartbeat_at=position.time,
                    heartbeat_seq=position.seq,
                    resources=event.resources,
                    actuator_capabilities=event.actuator_capabilities,
                ),
            )
        case HostRegistered():
            old = state.hosts.get(event.host_id) or HostRecord(host_id=event.host_id)
            return _put(
                state,
                msgspec.structs.replace(
                    old,
                    hostname=event.hostname,
                    resources=old.resources if old.heartbeat is not None else event.resources,
                    actuator_capabilities=event.actuator_capabilities,
                    registered_at=position.time,
                    revoked_at=None,
                    revoked_reason="",
                ),
            )
        case CredentialRevoked():
            old = state.hosts.get(event.host_id) or HostRecord(host_id=event.host_id)
            return _put(state, msgspec.structs.replace(old, revoked_at=position.time, revoked_reason=event.reason))
        case ProtectionTransition():
            old = state.hosts.get(event.host_id) or HostRecord(host_id=event.host_id)
            return _put(
                state,
                msgspec.structs.replace(
                    old, protection_state=event.to_state, protection_reason=event.reason, protection_at=position.time
                ),
            )
        case QualificationRecorded():
            old = state.hosts.get(event.host_id) or HostRecord(host_id=event.host_id)
            return _put(state, msgspec.structs.replace(old, qualifications=_with_qualification(old, event, position)))
        case HostOverride():
            old = state.hosts.get(event.host_id) or HostRecord(host_id=event.host_id)
            override = (
                None
                if event.state is None
                else OverrideRecord(event.state, event.reason, position.time, event.expires_at)
            )
            return _put(state, msgspec.structs.replace(old, override=override))
    return state


def _with_qualification(old: HostRecord, event: QualificationRecorded,
                         position: Position) -> tuple[QualificationView, ...]:
    """The host's qualifications with this one replacing its (runtime, model) predecessor."""
    latest = QualificationView(
        runtime=event.runtime, model_id=event.model_id, artifact_sha256=event.artifact_sha256,
        passed=event.result == QUALIFICATION_PASSED, failed_step=event.failed_step, reason=event.reason,
        recorded_at=position.time,
    )
    kept = [q for q in old.qualifications if (q.runtime, q.model_id) != (event.runtime, event.model_id)]
    return tuple(sorted((*kept, latest), key=lambda q: (q.runtime, q.model_id)))


def effective_state(record: HostRecord, now: float) -> str:
    """Local state from the latest heartbeat, tightened (never relaxed) by a live override."""
    local = record.heartbeat.state if record.heartbeat is not None else "unhealthy"
    override = record.override
    if override is not None and (override.expires_at is None or override.expires_at > now):
        if _FENCE_RANK.get(override.state, 0) > _FENCE_RANK.get(local, 0):
            return override.state
    return local


def evacuating_since(state: FleetState, now: float) -> dict[str, float]:
    """Host id -> log time it entered the draining (evacuating) state, for hosts draining at `now`.

    The agent's protection transition to draining when that is what its heartbeat reports, else
    the controller-side override's time; a draining host with neither is left out (no deadline).
    """
    out: dict[str, float] = {}
    for host_id in sorted(state.hosts):
        record = state.hosts[host_id]
        if effective_state(record, now) != "draining":
            continue
        local = record.heartbeat.state if record.heartbeat is not None else None
        override = record.override
        if local == "draining" and record.protection_state == "draining" and record.protection_at is not None:
            out[host_id] = record.protection_at
        elif override is not None and override.state == "draining":
            out[host_id] = override.set_at
    return out


def _residency_view(hb_at: float, r: object) -> ResidencyView:
    from grid.events.host import Residency

    assert isinstance(r, Residency)
    return ResidencyView(
        model_id=r.model_id,
        memory_mb=r.memory_mb,
        state=r.state,
        managed=r.managed,
        runtime=r.runtime,
        artifact_sha256=r.artifact_sha256,
        loaded_at=None if r.loaded_age_seconds is None else hb_at - max(0.0, r.loaded_age_seconds),
        last_used_at=None if r.last_used_age_seconds is None else hb_at - max(0.0, r.last_used_age_seconds),
        active_requests=r.active_requests,
        max_concurrency=r.max_concurrency,
        pinned=r.pinned,
        endpoint=r.endpoint,
        devices=r.devices,
    )


def host_view(record: HostRecord, now: float) -> HostView | None:
    hb = record.heartbeat
    resources = record.resources
    if resources is None:
        return None
    if hb is None or record.heartbeat_at is None:
        return HostView(
            host_id=record.host_id,
            state=effective_state(record, now),
            resources=resources,
            actuator_capabilities=record.actuator_capabilities,
            qualifications=record.qualifications,
        )
    hb_at = record.heartbeat_at
    return HostView(
        host_id=record.host_id,
        state=effective_state(record, now),
        resources=resources,
        residencies=tuple(
            sorted((_residency_view(hb_at, r) for r in hb.residencies), key=lambda v: (v.model_id, v.state))
        ),
        cached=tuple(sorted(hb.cached, key=lambda c: (c.model_id, c.sha256))),
        disk_free_bytes=hb.disk_free_bytes,
        disk_total_bytes=hb.disk_total_bytes,
        load=hb.load,
        unmanaged_memory_mb=hb.unmanaged_memory_mb,
        actuator_capabilities=hb.actuator_capabilities,
        heartbeat_at=hb_at,
        qualifications=record.qualifications,
    )


def snapshots(state: FleetState, now: float) -> tuple[HostView, ...]:
    out = []
    for host_id in sorted(state.hosts):
        snap = host_view(state.hosts[host_id], now)
        if snap is not None:
            out.append(snap)
    return tuple(out)
