"""Who may connect at all: no credential, a forged one, an expired one, one that expires live."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import nats.errors
import pytest
from nats_jwt.nkeys_ext import create_account_pair, create_user_pair

from grid.events.log import LogError
from grid.identity import jwt
from grid.identity.connect import connect_log
from grid.identity.creds import write_creds
from grid.identity.permissions import Principal, Role, grant_for
from grid.transport.jetstream import JetStreamLog
from tests.security.conftest import CredsFactory, SecuredNats, event, raw_client, stream_sequences


async def test_no_credential_is_refused(secured_server: SecuredNats, controller_log: JetStreamLog) -> None:
    before = await stream_sequences(controller_log)
    with pytest.raises(LogError, match="(?i)authorization violation"):
        await connect_log(secured_server.url, name="anonymous", ensure_streams=False)
    with pytest.raises(Exception, match="(?i)authorization violation"):
        await raw_client(secured_server, None)
    assert await stream_sequences(controller_log) == before


async def test_credential_from_another_account_is_refused(secured_server: SecuredNats, tmp_path: Path) -> None:
    # An attacker's own account key signing a controller-shaped JWT: the operator never signed it.
    rogue_account, user = create_account_pair(), create_user_pair()
    public = user.public_key.decode()
    grant = grant_for(Principal(Role.CONTROLLER), public)
    claims = jwt.user_claims(public, "controller", pub_allow=list(grant.pub_allow), pub_deny=[],
                             sub_allow=list(grant.sub_allow), sub_deny=[], allow_responses=True, expires_at=None)
    forged = write_creds(tmp_path / "forged.creds", jwt.encode(claims, rogue_account, issued_at=int(time.time())),
                         user.seed)
    with pytest.raises(LogError, match="(?i)authorization violation"):
        await connect_log(secured_server.url, credentials=forged, ensure_streams=False)


async def test_expired_credential_is_refused(secured_server: SecuredNats, creds: CredsFactory) -> None:
    expired = creds(Role.HOST, host_id="node-1", ttl=3600.0, now=time.time() - 7200.0)
    with pytest.raises(LogError, match="(?i)(authorization violation|expired)"):
        await connect_log(secured_server.url, credentials=expired, ensure_streams=False)


async def test_credential_expiring_while_connected_is_disconnected(
    secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog
) -> None:
    short = creds(Role.HOST, host_id="node-1", ttl=2.0)
    host = await connect_log(secured_server.url, credentials=short, ensure_streams=False)
    try:
        await host.append(event("host.heartbeat.v1", host_id="node-1"))
        deadline = time.monotonic() + 10.0
        while host.client.is_connected and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not host.client.is_connected
        with pytest.raises((LogError, nats.errors.Error)):
            await host.append(event("host.heartbeat.v1", host_id="node-1"))
    finally:
        await host.client.close()
    assert await controller_log.last_sequence("GRID_HOSTS") == 1
