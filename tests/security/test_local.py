"""`gridctl up` on one machine: every local process gets its own credential with no extra step."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from grid.events.subjects import COMMANDS_STREAM, CONTROL_STREAM, HOSTS_STREAM, REQUESTS_STREAM, command_subject
from grid.identity.authority import Authority
from grid.identity.creds import credential_principal, creds_claims
from grid.identity.local import AUTHORITY_DIR, ensure_local_credentials
from grid.identity.provision import provision_host_consumer
from grid.identity.server import SecuredEmbeddedNats
from grid.identity.connect import connect_log
from tests.security.conftest import event, host_ingress

HOST = "local"


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "grid-home"


async def test_local_processes_connect_with_their_own_credentials(home: Path) -> None:
    local = ensure_local_credentials(home, host_ids=[HOST], now=time.time())
    server = SecuredEmbeddedNats(home / "nats", Authority(home / AUTHORITY_DIR))
    server.start()
    try:
        controller = await connect_log(server.url, credentials=local.controller)
        host_principal = credential_principal(local.hosts[HOST])
        assert host_principal is not None
        await provision_host_consumer(controller, host_principal)
        await controller.append(event("command.issued.v1", host_id=HOST))
        agent = await connect_log(server.url, credentials=local.hosts[HOST], ensure_streams=False)
        gateway = await connect_log(server.url, credentials=local.gateway, ensure_streams=False)
        cli = await connect_log(server.url, credentials=local.operator, ensure_streams=False)
        try:
            async with host_ingress(controller):  # a host's appends are stored through it
                await agent.append(event("host.heartbeat.v1", host_id=HOST))
            sub = await agent.subscribe(COMMANDS_STREAM, durable=host_principal.command_consumer,
                                        subject_filter=command_subject(HOST))
            got = await sub.next(timeout=5)
            assert got is not None
            await sub.ack(got)
            await sub.close()
            await gateway.append(event("request.batch.v1"))
            assert [m.seq async for m in gateway.replay(HOSTS_STREAM)] == [1]
            await cli.append(event("control.mode_set.v1"))
            assert [m.seq async for m in cli.replay(REQUESTS_STREAM)] == [1]
            assert await controller.last_sequence(CONTROL_STREAM) == 1
        finally:
            for log in (agent, gateway, cli, controller):
                await log.close()
    finally:
        server.stop()


def test_local_credentials_are_reused_while_valid_and_renewed_near_expiry(home: Path) -> None:
    now = time.time()
    first = ensure_local_credentials(home, host_ids=[HOST], now=now, host_ttl_seconds=3000.0)
    contents = {p: p.read_bytes() for p in (first.controller, first.gateway, first.operator, first.hosts[HOST])}
    for path in contents:
        assert path.stat().st_mode & 0o777 == 0o600
    again = ensure_local_credentials(home, host_ids=[HOST], now=now + 60, host_ttl_seconds=3000.0)
    assert {p: p.read_bytes() for p in contents} == contents
    assert "exp" not in creds_claims(again.controller)
    later = ensure_local_credentials(home, host_ids=[HOST], now=now + 2500, host_ttl_seconds=3000.0)
    assert later.hosts[HOST].read_bytes() != contents[first.hosts[HOST]]
    assert later.controller.read_bytes() == contents[first.controller]
    assert creds_claims(later.hosts[HOST])["exp"] == int(now + 2500 + 3000)
