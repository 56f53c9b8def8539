"""The fleet fold marks a host revoked (when, why) from its CredentialRevoked on, until a later
registration (which only a new credential can sign); records from older snapshots still decode."""

from __future__ import annotations

import msgspec

from grid.events import codec
from grid.events.control import CredentialRevoked
from grid.events.host import HostRegistered, HostResources
from grid.events.subjects import CONTROL_STREAM, HOSTS_STREAM
from grid.projections import fleet
from grid.projections.position import Position
from tests.heartbeats import heartbeat

T0 = 1_800_000_000.0


def test_a_revocation_marks_the_host_until_it_registers_again() -> None:
    state = fleet.apply(fleet.initial(), heartbeat("h1", at=T0), Position(HOSTS_STREAM, 1, T0))
    assert state.hosts["h1"].revoked_at is None
    revoked = CredentialRevoked(event_id="rv", at=T0 + 5, host_id="h1", keys=("UKEY",), reason="lost")
    state = fleet.apply(state, revoked, Position(CONTROL_STREAM, 1, T0 + 5.5))
    record = state.hosts["h1"]
    assert (record.revoked_at, record.revoked_reason) == (T0 + 5.5, "lost")  # receipt time, not the sender's
    assert record.heartbeat is not None  # what it last said stays known
    again = HostRegistered(event_id="reg", at=T0 + 60, host_id="h1", hostname="h1",
                           resources=HostResources(capacity_mb=8000))
    state = fleet.apply(state, again, Position(HOSTS_STREAM, 2, T0 + 60))
    assert (state.hosts["h1"].revoked_at, state.hosts["h1"].revoked_reason) == (None, "")


def test_a_record_from_before_the_mark_still_decodes() -> None:
    state = fleet.apply(fleet.initial(), heartbeat("h1", at=T0), Position(HOSTS_STREAM, 1, T0))
    raw = msgspec.json.decode(codec.encode_value(state))
    for record in raw["hosts"].values():
        del record["revoked_at"], record["revoked_reason"]
    old = msgspec.json.decode(msgspec.json.encode(raw), type=fleet.FleetState)
    assert old.hosts["h1"].revoked_at is None and old.hosts["h1"].revoked_reason == ""
