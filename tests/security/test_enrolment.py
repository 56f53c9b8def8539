"""Invite, join, renew and revoke, over a real nats-server in operator mode."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import nats
import pytest

from grid.events.log import LogError
from grid.events.subjects import COMMANDS_STREAM, HOSTS_STREAM, command_subject
from grid.identity import jwt
from grid.identity.authority import Authority, push_account_jwts
from grid.identity.connect import connect_log
from grid.identity.creds import connect_options, read_creds
from grid.identity.enrolment import (
    REFUSED_BAD_PROOF,
    REFUSED_HOST_REVOKED,
    REFUSED_INVITEE_REFUSED,
    REFUSED_UNPROVEN_REPLY,
    Enrolment,
    EnrolmentRefused,
    EnrolmentService,
    JoinRequest,
    join,
    join_statement,
    renew,
)
from grid.identity.invitations import (
    REFUSED_INVITATION_EXPIRED,
    REFUSED_INVITATION_USED,
    REFUSED_UNKNOWN_INVITATION,
    InvitationStore,
    JoinToken,
)
from grid.identity.permissions import ENROL_JOIN_SUBJECT, Role
from grid.identity.provision import provision_host_consumer
from grid.identity.signing import Identity, Signer
from grid.transport.jetstream import JetStreamLog
from tests.security.conftest import CredsFactory, SecuredNats, event, invitee_client, stream_sequences

HOST = "edge-7"


class Clock:
    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@pytest.fixture
async def enrolment(
    secured_server: SecuredNats, authority: Authority, controller_log: JetStreamLog, tmp_path: Path
) -> AsyncIterator[tuple[EnrolmentService, Clock]]:
    clock = Clock()
    service = EnrolmentService(
        authority, InvitationStore(tmp_path / "invitations.json"), clock=clock,
        on_admitted=lambda host: provision_host_consumer(controller_log, host),
        sign=controller_log.authorship.sign,  # type: ignore[union-attr]
    )
    await service.serve(controller_log.client)
    try:
        yield service, clock
    finally:
        await service.stop()


def _token(service: EnrolmentService, server: SecuredNats, **kwargs: object) -> JoinToken:
    _, token = service.invite(HOST, servers=(server.url,), tls_fingerprint=None, **kwargs)  # type: ignore[arg-type]
    return token


async def test_join_gives_a_host_credential_bound_to_the_invited_id(
    enrolment: tuple[EnrolmentService, Clock], secured_server: SecuredNats, controller_log: JetStreamLog,
    tmp_path: Path, authority: Authority,
) -> None:
    service, _ = enrolment
    token = _token(service, secured_server, failure_domain="rack-2", tags=("gpu",), dedicated=True)
    text = token.encode()
    joined = await join(text, tmp_path / "host-home")
    assert isinstance(joined, Enrolment), joined
    assert (joined.host_id, joined.failure_domain, joined.tags, joined.dedicated) == (HOST, "rack-2", ("gpu",), True)
    creds_path = Path(joined.creds_path)
    assert creds_path.stat().st_mode & 0o777 == 0o600
    assert creds_path.parent.stat().st_mode & 0o777 == 0o700
    user_jwt, seed = read_creds(creds_path)
    claims = jwt.verify(user_jwt, authority.host_account_public(HOST))  # a host account of its own
    assert claims["sub"] == authority.registry.hosts[HOST].keys[-1]
    assert 0 < claims["exp"] - time.time() <= 24 * 3600
    # Neither the host's seed nor the invitation secret is stored on the controller's side.
    stored = b"".join(p.read_bytes() for p in [*authority.directory.rglob("*"), *tmp_path.glob("invitations*")]
                      if p.is_file())
    assert seed.encode() not in stored and token.secret.encode() not in stored

    # The credential works as that host, and only as that host.
    await controller_log.append(event("command.issued.v1", host_id=HOST))
    host = await connect_log(secured_server.url, credentials=creds_path, ensure_streams=False)
    try:
        assert (await host.append(event("host.heartbeat.v1", host_id=HOST))).stream == HOSTS_STREAM
        sub = await host.subscribe(COMMANDS_STREAM, durable=joined.command_consumer,
                                   subject_filter=command_subject(HOST))
        got = await sub.next(timeout=5)
        assert got is not None
        await sub.ack(got)
        await sub.close()
        with pytest.raises(LogError, match="timed out"):
            host._timeout = 1.0
            await host.append(event("host.heartbeat.v1", host_id="someone-else"))
    finally:
        await host.close()
    assert await controller_log.last_sequence(HOSTS_STREAM) == 1


async def test_an_invitation_is_single_use(
    enrolment: tuple[EnrolmentService, Clock], secured_server: SecuredNats, tmp_path: Path
) -> None:
    service, _ = enrolment
    token = _token(service, secured_server)
    assert not isinstance(await join(token, tmp_path / "first"), EnrolmentRefused)
    # The invitee credential died with that join: the token cannot even connect again.
    await refused_at_connect(secured_server, token)
    assert await join(token, tmp_path / "second") == EnrolmentRefused(REFUSED_INVITEE_REFUSED)
    assert not (tmp_path / "second" / "host.creds").exists()
    # Behind that, the invitation is spent: a live invitee credential with its secret is refused.
    other = _token(service, secured_server)
    reused = msgspec.structs.replace(other, secret=token.secret)
    assert await join(reused, tmp_path / "third") == EnrolmentRefused(REFUSED_INVITATION_USED)
    assert not (tmp_path / "third" / "host.creds").exists()
    await refused_at_connect(secured_server, other)  # a spent invitation's invitee is revoked too
    assert await revocations_counted(service, 2) == 2 and service.revoke_failures == 0


async def refused_at_connect(server: SecuredNats, token: JoinToken, *, within: float = 5.0) -> None:
    """The token's invitee credential is refused by the server (its revocation was pushed)."""
    deadline = time.monotonic() + within
    while True:
        try:
            nc = await invitee_client(server, token)
        except Exception as exc:  # noqa: BLE001 - the refusal is what we wait for
            assert "authorization violation" in str(exc).lower(), exc
            return
        await nc.close()
        assert time.monotonic() < deadline, "the invitee credential still connects"
        await asyncio.sleep(0.05)


async def revocations_counted(service: EnrolmentService, expected: int, *, within: float = 5.0) -> int:
    """The service's count of invitee revocations once it reached `expected` (or `within` passed).
    The server applies a pushed revocation before the service's push coroutine resumes to count
    it, so a refusal at connect can be seen a moment before the count."""
    deadline = time.monotonic() + within
    while service.invitees_revoked < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return service.invitees_revoked


async def test_an_expired_invitation_is_refused(
    enrolment: tuple[EnrolmentService, Clock], secured_server: SecuredNats, tmp_path: Path
) -> None:
    service, clock = enrolment
    token = _token(service, secured_server, ttl_seconds=600.0)
    clock.offset = 601.0
    assert await join(token, tmp_path / "late") == EnrolmentRefused(REFUSED_INVITATION_EXPIRED)
    assert not (tmp_path / "late" / "host.creds").exists()


async def test_an_expired_invitee_credential_cannot_connect(
    enrolment: tuple[EnrolmentService, Clock], secured_server: SecuredNats, tmp_path: Path
) -> None:
    service, clock = enrolment
    clock.offset = -3600.0  # invited an hour ago, for ten minutes
    token = _token(service, secured_server, ttl_seconds=600.0)
    assert await join(token, tmp_path / "late") == EnrolmentRefused(REFUSED_INVITEE_REFUSED)
    assert not (tmp_path / "late" / "host.creds").exists()


async def test_a_join_without_proof_of_the_key_is_refused(
    enrolment: tuple[EnrolmentService, Clock], secured_server: SecuredNats, creds: CredsFactory
) -> None:
    service, _ = enrolment
    token = _token(service, secured_server)
    victim_key = read_creds(creds(Role.HOST, host_id="node-9"))[0]
    victim_public = jwt.decode(victim_key)["sub"]
    # Asks for a JWT for somebody else's public key, signing with nothing of theirs.
    request = JoinRequest(secret=token.secret, public_key=victim_public, nonce="n",
                          signature="AAAA" + "A" * 84)
    invitee = await invitee_client(secured_server, token)
    body = msgspec.json.encode(request)
    try:
        reply = await invitee.request(ENROL_JOIN_SUBJECT, body, timeout=5,
                                      headers=Signer(token.invitee_jwt, token.invitee_seed).sign(ENROL_JOIN_SUBJECT, body))
    finally:
        await invitee.close()
    assert msgspec.json.decode(reply.data)["refused"] == REFUSED_BAD_PROOF
    assert join_statement(token.secret, victim_public, "n")  # the statement it would have had to sign


async def test_the_invitee_credential_can_only_ask_to_join(
    enrolment: tuple[EnrolmentService, Clock], secured_server: SecuredNats, controller_log: JetStreamLog
) -> None:
    service, _ = enrolment
    token = _token(service, secured_server)
    before = await stream_sequences(controller_log)
    invitee = await invitee_client(secured_server, token)
    try:
        await invitee.publish("grid.host.edge-7.heartbeat", b"{}")
        await invitee.publish("grid.cmd.edge-7", b"{}")
        await invitee.publish("grid.enrol.renew", b"{}")
        await invitee.flush()
        await asyncio.sleep(0.5)
        errors = " ".join(str(e).lower() for e in invitee.permission_errors)  # type: ignore[attr-defined]
    finally:
        await invitee.close()
    for subject in ("grid.host.edge-7.heartbeat", "grid.cmd.edge-7", "grid.enrol.renew"):
        assert f'permissions violation for publish to "{subject}"' in errors
    assert await stream_sequences(controller_log) == before


async def test_renewal_with_the_current_credential_extends_it(
    enrolment: tuple[EnrolmentService, Clock], secured_server: SecuredNats, tmp_path: Path
) -> None:
    service, clock = enrolment
    joined = await join(_token(service, secured_server), tmp_path / "host-home")
    assert isinstance(joined, Enrolment), joined
    creds_path = Path(joined.creds_path)
    old_jwt, seed = read_creds(creds_path)
    nc = await nats.connect(secured_server.url, allow_reconnect=False, **connect_options(creds_path, None))
    try:
        clock.offset = 3600.0
        expires_at = await renew(nc, creds_path, now=clock())
    finally:
        await nc.close()
    new_jwt, new_seed = read_creds(creds_path)
    assert new_seed == seed and new_jwt != old_jwt
    assert jwt.decode(new_jwt)["sub"] == jwt.decode(old_jwt)["sub"]
    assert jwt.decode(new_jwt)["exp"] > jwt.decode(old_jwt)["exp"]
    assert expires_at == pytest.approx(jwt.decode(new_jwt)["exp"], abs=1.0)
    host = await connect_log(secured_server.url, credentials=creds_path, ensure_streams=False)
    await host.append(event("host.heartbeat.v1", host_id=HOST))
    await host.close()


async def test_a_revoked_host_is_disconnected_refused_at_connect_and_at_renewal(
    enrolment: tuple[EnrolmentService, Clock], secured_server: SecuredNats, authority: Authority,
    controller_log: JetStreamLog, tmp_path: Path,
) -> None:
    service, _ = enrolment
    joined = await join(_token(service, secured_server), tmp_path / "host-home")
    assert isinstance(joined, Enrolment), joined
    creds_path = Path(joined.creds_path)
    host = await connect_log(secured_server.url, credentials=creds_path, ensure_streams=False)
    await host.append(event("host.heartbeat.v1", host_id=HOST))

    # Revoked the way `gridctl node revoke` does it: from another process's view of the authority.
    updates = Authority(authority.directory).revoke_host(HOST, now=time.time())
    # Renewal is refused as soon as the authority has revoked the host (before servers hear of it).
    assert await renew(host.client, creds_path) == EnrolmentRefused(REFUSED_HOST_REVOKED)

    system = await nats.connect(secured_server.url, **connect_options(authority.system_creds(now=time.time()), None))
    try:
        started = time.monotonic()
        await push_account_jwts(system, updates)
        while host.client.is_connected and time.monotonic() - started < 5.0:
            await asyncio.sleep(0.05)
        assert not host.client.is_connected, "a revoked host must be disconnected within seconds"
    finally:
        await system.close()
        await host.client.close()
    with pytest.raises(LogError, match="(?i)(authorization violation|revoked)"):
        await connect_log(secured_server.url, credentials=creds_path, ensure_streams=False)
    assert await controller_log.last_sequence(HOSTS_STREAM) == 1


async def test_a_join_answer_no_controller_signed_is_not_trusted(
    secured_server: SecuredNats, authority: Authority, controller_log: JetStreamLog, tmp_path: Path,
    creds: CredsFactory,
) -> None:
    """The joining host keeps nothing from an answer its grid's controller did not sign for its
    own inbox: an unsigned answer, or one signed by a host of the grid."""
    host = Identity.from_creds(creds(Role.HOST, host_id="impostor"))
    for sign in (None, host.sign):
        service = EnrolmentService(authority, InvitationStore(tmp_path / f"inv-{sign is None}.json"), sign=sign,
                                   on_admitted=lambda h: provision_host_consumer(controller_log, h))
        await service.serve(controller_log.client)
        try:
            _, token = service.invite("node-unproven", servers=(secured_server.url,), tls_fingerprint=None)
            outcome = await join(token.encode(), tmp_path / f"join-{sign is None}")
        finally:
            await service.stop()
        assert outcome == EnrolmentRefused(REFUSED_UNPROVEN_REPLY)
        assert not (tmp_path / f"join-{sign is None}" / "host.creds").exists()


async def test_gridctl_invite_with_a_server_list_makes_a_token_node_join_redeems_with_the_first_down(
    enrolment: tuple[EnrolmentService, Clock], secured_server: SecuredNats, operator_home: Path,
    authority: Authority, tmp_path: Path,
) -> None:
    """Real gridctl processes: `invite --nats a,b` gives one server each in the token, and
    `node join` gets in through the second while the first is down."""
    import json
    import os
    import socket
    import subprocess
    import sys

    from grid.identity.service import invitation_store

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        down = f"nats://127.0.0.1:{sock.getsockname()[1]}"
    token_file = operator_home / "operator.token"
    if not token_file.exists():
        token_file.write_text("operator-token-for-the-test\n")
        token_file.chmod(0o600)
    env = {**os.environ, "GRID_HOME": str(operator_home)}
    env.pop("GRID_AGENT_STATE_DIR", None)

    async def gridctl(environ: dict[str, str], *args: str) -> tuple[int, str, str]:
        # As a child process, with this loop free to run the enrolment service meanwhile.
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "grid.cli.main", *args, env=environ,
                                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode or 0, out.decode(), err.decode()

    code, out, err = await gridctl(env, "invite", "--host-id", "listed-1", "--nats", f"{down},{secured_server.url}",
                                   "--json")
    assert code == 0, err
    token = JoinToken.decode(json.loads(out)["token"])
    assert token.servers == (down, secured_server.url)

    # The grid's own invitation store (where `gridctl invite` wrote it) is what the service redeems.
    service, _ = enrolment
    service.invitations = invitation_store(authority)
    node_env = {**env, "GRID_HOME": str(tmp_path / "node-home")}
    code, out, err = await gridctl(node_env, "node", "join", token.encode(), "--json")
    assert code == 0, err
    answer = json.loads(out)
    assert answer["host_id"] == "listed-1"
    assert answer["server"] == f"{down},{secured_server.url}"


async def test_only_the_controller_in_charge_answers_joins(
    enrolment: tuple[EnrolmentService, Clock], secured_server: SecuredNats, authority: Authority,
    creds: CredsFactory, tmp_path: Path,
) -> None:
    """A standby controller (same authority, its own invitation store) receives every join too and
    stays silent: with a queue group it took half of them and refused each as an unknown
    invitation, spending the token. Every join reaches the one in charge, whichever is asked."""
    service, _ = enrolment
    in_charge = [False]
    # The standby's own connection, as a second controller process has.
    standby_log = await connect_log(secured_server.url, name="grid-controller-2",
                                    credentials=creds(Role.CONTROLLER), ensure_streams=False)
    standby = EnrolmentService(authority, InvitationStore(tmp_path / "standby-invitations.json"),
                               sign=standby_log.authorship.sign)  # type: ignore[union-attr]
    standby.answering = lambda: in_charge[0]
    await standby.serve(standby_log.client)
    try:
        for n in range(4):
            joined = await join(_token(service, secured_server), tmp_path / f"host-{n}")
            assert isinstance(joined, Enrolment), (n, joined)
        assert standby.revoke_failures == 0 and await revocations_counted(service, 4) == 4
        assert standby.invitees_revoked == 0
        # Put in charge (it took the lease), the standby answers and the other is silent: a token
        # only the other's store holds is refused there, by the standby.
        in_charge[0] = True
        service.answering = lambda: False
        refused = await join(_token(service, secured_server), tmp_path / "elsewhere")
        assert refused == EnrolmentRefused(REFUSED_UNKNOWN_INVITATION)
        assert not (tmp_path / "elsewhere" / "host.creds").exists()
        assert await revocations_counted(standby, 1) == 1
    finally:
        await standby.stop()
        await standby_log.close()
