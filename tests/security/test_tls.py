"""TLS on the NATS listener: Grid's private CA, and the join token's pinned fingerprint."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from grid.events.log import LogError
from grid.events.subjects import HOSTS_STREAM
from grid.identity.authority import Authority
from grid.identity.connect import connect_log
from grid.identity.enrolment import Enrolment, EnrolmentService, join
from grid.identity.invitations import InvitationStore
from grid.identity.permissions import Role
from grid.identity.provision import provision_host_consumer
from grid.identity.tls import TLSMaterial, TLSMaterialError
from grid.transport.jetstream import JetStreamLog
from tests.conftest import reset_streams
from tests.security.conftest import CredsFactory, SecuredNats, event, host_ingress

HOST = "remote-3"


@pytest.fixture(scope="module")
def tls_material(tmp_path_factory: pytest.TempPathFactory) -> TLSMaterial:
    return TLSMaterial(tmp_path_factory.mktemp("tls") / "tls").ensure(
        ["127.0.0.1", "localhost"], now=dt.datetime.now(dt.timezone.utc)
    )


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory, authority: Authority,
               tls_material: TLSMaterial) -> Iterator[SecuredNats]:
    server = SecuredNats(tmp_path_factory.mktemp("tls-nats"), authority, tls=tls_material)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def tls_controller(tls_server: SecuredNats, creds: CredsFactory,
                         tls_material: TLSMaterial) -> AsyncIterator[JetStreamLog]:
    log = await connect_log(tls_server.url, credentials=creds(Role.CONTROLLER), tls_ca=tls_material.ca_cert)
    await reset_streams(log)
    try:
        async with host_ingress(log):
            yield log
    finally:
        await log.close()


@pytest.fixture
async def service(authority: Authority, tls_controller: JetStreamLog, tls_material: TLSMaterial,
                  tmp_path: Path) -> AsyncIterator[EnrolmentService]:
    service = EnrolmentService(authority, InvitationStore(tmp_path / "invitations.json"),
                               ca_pem=tls_material.ca_cert.read_text(),
                               on_admitted=lambda host: provision_host_consumer(tls_controller, host),
                               sign=tls_controller.authorship.sign)
    await service.serve(tls_controller.client)
    try:
        yield service
    finally:
        await service.stop()


def test_material_is_owner_only_and_reused(tls_material: TLSMaterial) -> None:
    assert tls_material.directory.stat().st_mode & 0o777 == 0o700
    for path in tls_material.directory.iterdir():
        assert path.stat().st_mode & 0o777 == 0o600, path
    before = tls_material.server_fingerprint()
    tls_material.ensure(["127.0.0.1", "localhost"], now=dt.datetime.now(dt.timezone.utc))
    assert tls_material.server_fingerprint() == before
    tls_material.ensure(["127.0.0.1", "grid.example"], now=dt.datetime.now(dt.timezone.utc))
    assert tls_material.server_fingerprint() != before
    tls_material.ensure(["127.0.0.1", "localhost"], now=dt.datetime.now(dt.timezone.utc))


async def test_join_over_tls_pins_the_fingerprint_then_trusts_the_ca(
    tls_server: SecuredNats, service: EnrolmentService, tls_material: TLSMaterial, tls_controller: JetStreamLog,
    tmp_path: Path,
) -> None:
    _, token = service.invite(HOST, servers=(tls_server.url,), tls_fingerprint=tls_material.server_fingerprint())
    joined = await join(token.encode(), tmp_path / "host-home")
    assert isinstance(joined, Enrolment), joined
    assert joined.ca_path is not None and Path(joined.ca_path).read_bytes() == tls_material.ca_cert.read_bytes()
    host = await connect_log(tls_server.url, credentials=Path(joined.creds_path),
                                      tls_ca=Path(joined.ca_path), ensure_streams=False)
    try:
        await host.append(event("host.heartbeat.v1", host_id=HOST))
    finally:
        await host.close()
    assert await tls_controller.last_sequence(HOSTS_STREAM) == 1


async def test_a_server_with_another_certificate_is_not_trusted_at_join(
    tls_server: SecuredNats, service: EnrolmentService, tmp_path: Path
) -> None:
    _, token = service.invite(HOST, servers=(tls_server.url,), tls_fingerprint="sha256:" + "0" * 64)
    with pytest.raises(TLSMaterialError, match="not the pinned"):
        await join(token, tmp_path / "host-home")
    assert not (tmp_path / "host-home" / "host.creds").exists()


async def test_clients_without_the_ca_or_without_tls_cannot_connect(
    tls_server: SecuredNats, creds: CredsFactory
) -> None:
    host_creds = creds(Role.HOST, host_id=HOST)
    with pytest.raises(LogError, match="(?i)certificate"):
        await connect_log(tls_server.url, credentials=host_creds, ensure_streams=False)
    plain = f"nats://127.0.0.1:{tls_server.port}"
    with pytest.raises(LogError):
        await connect_log(plain, credentials=host_creds, ensure_streams=False)


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_a_join_over_tls_with_the_first_listed_server_down_pins_the_next(
    tls_server: SecuredNats, service: EnrolmentService, tls_material: TLSMaterial, tmp_path: Path,
) -> None:
    # A cluster's list as --nats gives it (one comma-separated string): the token holds each server.
    listed = f"tls://127.0.0.1:{_closed_port()},{tls_server.url}"
    _, token = service.invite(HOST, servers=(listed,), tls_fingerprint=tls_material.server_fingerprint())
    assert len(token.servers) == 2 and token.servers[1] == tls_server.url
    joined = await join(token.encode(), tmp_path / "host-home")
    assert isinstance(joined, Enrolment), joined


async def test_a_tls_join_prints_no_asyncio_eof_warning(
    tls_server: SecuredNats, service: EnrolmentService, tls_material: TLSMaterial, tmp_path: Path,
) -> None:
    """nats-py's TLS stream protocol answers EOF with True, which asyncio's SSL layer warns about
    on every closed TLS connection; Grid's logging setup drops that one line (grid.logs)."""
    import asyncio
    import os
    import subprocess
    import sys

    _, token = service.invite(HOST, servers=(tls_server.url,), tls_fingerprint=tls_material.server_fingerprint())
    env = {**os.environ, "GRID_HOME": str(tmp_path / "node-home")}
    env.pop("GRID_AGENT_STATE_DIR", None)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "grid.cli.main", "node", "join", token.encode(),
                                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert "eof_received" not in (out + err).decode(), err.decode()
