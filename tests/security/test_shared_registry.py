"""Controllers keep their authority state in step through NATS (grid.identity.shared_registry).

Real parts: the module's secured nats-server, two real controllers with their identity services
on one log (A, the authority's first machine; B, started from a copy of A's identity directory
made before anything was admitted, as `gridctl machine add controller` bundles it), a real join
with an invitation made on A, `gridctl node revoke`'s revocation on A's machine, and a third
controller started later from the same stale copy.

Found: a host admitted on A after B's bundle was unknown to B, so once B held the lease it could
not renew the host (it lacked the host account's seed) and the host was cut off when its
credential expired; a controller starting from a stale copy pushed an INFER account JWT without
the hosts admitted elsewhere (the gateways lost their routes to them); and revocations made on A
were not in B's registry.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import nats
import nkeys
import pytest

from grid.controller.service import Controller, ControllerSettings
from grid.identity import jwt
from grid.identity.admin import invite, revoke
from grid.identity.authority import Authority, HostIdentityRecord
from grid.identity.connect import connect_log
from grid.identity.creds import connect_options, read_creds
from grid.identity.enrolment import REFUSED_HOST_REVOKED, Enrolment, RenewRequest, join, renew, renew_statement
from grid.identity.invitations import InvitationStore
from grid.identity.permissions import Role
from grid.identity.service import INVITATIONS_FILE, ControllerIdentity
from grid.identity.shared_registry import (
    KIND_HOST,
    REJECTED_UNDECRYPTABLE,
    REJECTED_UNSEALED,
    SharedHost,
    SharedRecord,
    record_key,
    seal_record,
)
from grid.transport.jetstream import JetStreamLog
from tests.security.conftest import CredsFactory, SecuredNats

SETTINGS = ControllerSettings(lease_ttl_seconds=3.0, lease_renew_seconds=0.2, lease_margin_seconds=0.3,
                              background_ticks=False, snapshot_interval_seconds=3600.0)


async def until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} not within {timeout:g}s"
        await asyncio.sleep(0.1)


async def infer_imports(server: SecuredNats, authority: Authority) -> set[str]:
    """The host accounts whose inference the INFER account JWT the servers hold imports."""
    nc = await nats.connect(server.url, allow_reconnect=False,
                            **connect_options(authority.system_creds(now=time.time()), None))
    try:
        reply = await nc.request(f"$SYS.REQ.ACCOUNT.{authority.infer_account_public}.CLAIMS.LOOKUP", b"", timeout=5)
    finally:
        await nc.close()
    claims = jwt.decode(reply.data.decode())
    return {i["account"] for i in claims["nats"].get("imports", [])}


def renew_request(creds_path: Path) -> bytes:
    """The renewal request `renew` sends (signed with the host's key), for a host whose
    connection the servers refuse since its revocation."""
    token, seed = read_creds(creds_path)
    nonce, signed_at = secrets.token_hex(8), time.time()
    signature = base64.b64encode(nkeys.from_seed(seed.encode()).sign(renew_statement(token, nonce, signed_at)))
    return msgspec.json.encode(RenewRequest(jwt=token, nonce=nonce, signed_at=signed_at, signature=signature.decode()))


@pytest.mark.timeout(60)
async def test_a_standby_from_a_stale_copy_renews_hosts_admitted_elsewhere_and_keeps_them_routed(
    secured_server: SecuredNats, authority: Authority, controller_log: JetStreamLog, creds: CredsFactory,
    operator_home: Path, tmp_path: Path,
) -> None:
    url = secured_server.url
    # B's and C's bundles: copies of A's identity directory before any host was admitted.
    stale_b, stale_c = tmp_path / "b" / "identity", tmp_path / "c" / "identity"
    shutil.copytree(authority.directory, stale_b)
    shutil.copytree(authority.directory, stale_c)
    log_b = await connect_log(url, credentials=creds(Role.CONTROLLER), name="grid-controller-b")
    a = Controller(controller_log, tmp_path / "home-a", settings=SETTINGS, controller_id="ctl-a",
                   identity=ControllerIdentity(authority.directory))
    b = Controller(log_b, tmp_path / "home-b", settings=SETTINGS, controller_id="ctl-b",
                   identity=ControllerIdentity(stale_b))
    a_running = False
    try:
        await a.start()
        a_running = True
        assert a.lease is not None and a.lease.held
        await b.start()
        assert b.lease is not None and not b.lease.held

        # Two hosts admitted on A (invitations made on A's machine, joins A answers).
        joined: dict[str, Enrolment] = {}
        for host_id in ("shared-1", "shared-2"):
            _, token = invite(operator_home, (url,), host_id=host_id, now=time.time())
            result = await join(token, tmp_path / host_id)
            assert isinstance(result, Enrolment), result
            joined[host_id] = result
        # A revokes each spent invitee (rewriting the authority's system.creds, which a concurrent
        # `revoke` on the same directory would also read: let it finish first).
        enrolment_a = a.identity.enrolment if isinstance(a.identity, ControllerIdentity) else None
        assert enrolment_a is not None
        await until(lambda: enrolment_a.invitees_revoked == 2, "A revoking the spent invitees")
        # One revoked on A's machine as `gridctl node revoke` does it there.
        await revoke(operator_home, url, "shared-2", reason="test")

        # B learns all of it while it stands by: the hosts (with their accounts' seeds), the
        # revocation, and the invitations A made (both used).
        view_b = Authority(stale_b)

        def b_knows() -> bool:
            view_b.reload()
            hosts = view_b.registry.hosts
            return ("shared-1" in hosts and "shared-2" in hosts and view_b.host_revoked("shared-2")
                    and not view_b.host_revoked("shared-1"))

        await until(b_knows, "B merging what A admitted and revoked")
        authority.reload()
        assert view_b.registry.hosts["shared-1"].account_seed == authority.registry.hosts["shared-1"].account_seed
        invitations_b = InvitationStore(stale_b / INVITATIONS_FILE).entries()
        assert sorted(i.host_id for i in invitations_b if i.used_at is not None) == ["shared-1", "shared-2"]

        # A's machine goes away; B takes the lease.
        await a.stop()
        a_running = False
        await until(lambda: b.lease is not None and b.lease.held, "B taking the lease")

        # The host admitted on A renews with B.
        creds_1 = Path(joined["shared-1"].creds_path)
        before, _ = read_creds(creds_1)
        nc = await nats.connect(url, allow_reconnect=False, **connect_options(creds_1, None))
        try:
            expires_at = await renew(nc, creds_1)
        finally:
            await nc.close()
        assert isinstance(expires_at, float), expires_at
        after, _ = read_creds(creds_1)
        assert after != before and jwt.verify(after, view_b.host_account_public("shared-1"))
        # The host revoked on A is refused by B (the servers refuse its connection already).
        identity_b = b.identity
        assert isinstance(identity_b, ControllerIdentity)
        refused = identity_b.enrolment.handle_renew(renew_request(Path(joined["shared-2"].creds_path)))
        assert refused.refused == REFUSED_HOST_REVOKED

        # The servers still route to shared-1 (and not to the revoked shared-2).
        host_1 = authority.host_account_public("shared-1")
        host_2 = authority.host_account_public("shared-2")
        imports = await infer_imports(secured_server, authority)
        assert host_1 in imports and host_2 not in imports

        # Junk on the host's subject (what a reflected API answer would store there) and a record
        # sealed under another grid's key: skipped and counted, never merged.
        await log_b.append_raw("grid.authority.host.shared-1", b'{"type":"io.nats.jetstream.api.v1.pub_ack"}')
        forged = SharedRecord(kind=KIND_HOST, name="shared-1", host=SharedHost(
            HostIdentityRecord(command_consumer="agent-forged", account_seed="SAforged", generation=99)))
        await log_b.append_raw(*seal_record(record_key(b"SAnother-grid"), forged))

        # A controller started later from the same stale copy catches up before it pushes
        # account JWTs: INFER still imports shared-1, and it knows the host.
        log_c = await connect_log(url, credentials=creds(Role.CONTROLLER), name="grid-controller-c")
        c = Controller(log_c, tmp_path / "home-c", settings=SETTINGS, controller_id="ctl-c",
                       identity=ControllerIdentity(stale_c))
        try:
            await c.start()
            imports = await infer_imports(secured_server, authority)
            assert host_1 in imports and host_2 not in imports
            view_c = Authority(stale_c)
            assert "shared-1" in view_c.registry.hosts and view_c.host_revoked("shared-2")
            shared_c = c.identity.shared if isinstance(c.identity, ControllerIdentity) else None
            assert shared_c is not None
            assert shared_c.rejected == {REJECTED_UNSEALED: 1, REJECTED_UNDECRYPTABLE: 1}
            assert view_c.registry.hosts["shared-1"].command_consumer != "agent-forged"
            assert any("shared authority records skipped" in w for w in c.status()["warnings"])
        finally:
            await c.stop()
            await log_c.close()
    finally:
        if a_running:
            await a.stop()
        await b.stop()
        await log_b.close()
