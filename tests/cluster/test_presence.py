"""presence_view: the lease decides who is active; silent controllers show as unresponsive."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from grid.controller.presence import (
    ACTIVE,
    ANNOUNCE_ACTIVE,
    ANNOUNCE_STANDBY,
    ANNOUNCE_STOPPED,
    STANDBY,
    STOPPED,
    UNRESPONSIVE,
    PresenceRecord,
    announce,
    presence_key,
    presence_view,
    read_presence,
)
from grid.events.log import LogError
from grid.identity.admin import sync_accounts
from grid.identity.authority import Authority
from grid.identity.connect import connect_log
from grid.identity.permissions import Principal, Role
from grid.identity.server import SecuredNatsCluster
from grid.identity.tls import TLSMaterial


def rec(cid: str, state: str, term: int = 1) -> PresenceRecord:
    return PresenceRecord(controller_id=cid, state=state, term=term, interval_seconds=1.0)


def test_the_lease_holder_is_active_and_silent_or_stopped_ones_say_so() -> None:
    now = 1000.0
    records = [
        (rec("b", ANNOUNCE_STANDBY), now - 0.5),
        (rec("a", ANNOUNCE_ACTIVE, 3), now - 10.0),  # believed itself active, silent for 10 intervals
        (rec("c", ANNOUNCE_ACTIVE, 4), now - 0.2),  # took over; its record says so, the lease agrees
        (rec("d", ANNOUNCE_STOPPED), now - 0.1),
    ]
    rows = presence_view(records, now=now, holder_id="c", holder_term=4)
    assert [(r["controller_id"], r["state"], r["term"]) for r in rows] == [
        ("c", ACTIVE, 4), ("b", STANDBY, 1), ("a", UNRESPONSIVE, 3), ("d", STOPPED, 1)]
    # A record claiming "active" is not believed without the lease.
    rows = presence_view([(rec("a", ANNOUNCE_ACTIVE, 3), now)], now=now, holder_id="c", holder_term=4)
    assert rows[0]["state"] == STANDBY


def test_presence_keys_are_kv_safe() -> None:
    assert presence_key("a4b595b1") == "presence.a4b595b1"
    odd = presence_key("ctl a/b.c*")
    assert odd.startswith("presence.") and all(ch.isalnum() for ch in odd.removeprefix("presence."))


async def test_only_a_controller_can_announce_itself(secured_cluster: SecuredNatsCluster, authority: Authority,
                                                     cluster_tls: TLSMaterial, tmp_path: Path) -> None:
    """Presence records live beside the lease: a host or the gateway cannot forge one."""

    def creds(principal: Principal, name: str) -> Path:
        return authority.issue_creds(principal, tmp_path / name, now=time.time(), ttl_seconds=3600)

    controller = await connect_log(secured_cluster.url, credentials=creds(Principal(Role.CONTROLLER), "c.creds"),
                                   tls_ca=cluster_tls.ca_cert)
    try:
        await announce(controller, rec("ctl-real", ANNOUNCE_ACTIVE))
        host = authority.host_principal("h1")
        await sync_accounts(authority, secured_cluster.url, tls_ca=cluster_tls.ca_cert)  # h1's own account
        for principal, name in ((host, "h.creds"), (Principal(Role.GATEWAY), "g.creds")):
            intruder = await connect_log(secured_cluster.url, credentials=creds(principal, name),
                                         tls_ca=cluster_tls.ca_cert, ensure_streams=False, timeout=2.0)
            try:
                # The server drops a publish the identity may not make: the writer hears nothing.
                with pytest.raises(LogError, match="timed out"):
                    await announce(intruder, rec("ctl-forged", ANNOUNCE_ACTIVE))
            finally:
                await intruder.close()
        ids = {r.controller_id for r, _ in await read_presence(controller)}
        assert ids == {"ctl-real"}
    finally:
        await controller.close()
