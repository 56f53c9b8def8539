"""An agent running with its host credential: commands through the consumer its credential
names, no command obeyed unless the controller it names is the one the lease names, and the
credential renewed before it expires."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path


from grid.agent.fencing import REASON_NOT_LEASE_HOLDER
from grid.agent.sensors import FixedSensors
from grid.agent.service import AgentOptions, HostAgent
from grid.config import GridConfig
from grid.events.lease import LEASE_KEY, LeaseRecord, encode_record
from grid.events.subjects import LEASE_BUCKET
from grid.identity import jwt
from grid.identity.authority import Authority
from grid.identity.connect import connect_log
from grid.identity.creds import read_creds
from grid.identity.enrolment import EnrolmentService
from grid.identity.invitations import InvitationStore
from grid.identity.permissions import Role
from grid.identity.provision import provision_host_consumer
from grid.transport.jetstream import JetStreamLog
from tests.integration.agent.agentkit import make_command, wait_ack
from tests.ports import engine_ports
from tests.security.conftest import CredsFactory, SecuredNats

HOST = "leased-host"
CONTROLLER = "ctl-real"
TERM = 3


async def test_a_command_naming_another_controller_is_refused_before_the_fence_moves(
    tmp_path: Path, secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog,
    authority: Authority,
) -> None:
    record = LeaseRecord(controller_id=CONTROLLER, term=TERM, ttl_seconds=15.0, renewed_at=time.time())
    await controller_log.kv_put(LEASE_BUCKET, LEASE_KEY, encode_record(record, controller_log.authorship))
    host_creds = creds(Role.HOST, host_id=HOST)
    await provision_host_consumer(controller_log, authority.host_principal(HOST))
    agent_log = await connect_log(secured_server.url, credentials=host_creds, name="grid-agent",
                                  ensure_streams=False)
    config = GridConfig(home=tmp_path / "home", nats_url=None)
    agent = HostAgent(agent_log, config, AgentOptions(host_id=HOST, credentials=host_creds, heartbeat_interval=0.3,
                                                      sample_interval=0.1, port_range=engine_ports()),
                      sensor_source=FixedSensors())
    try:
        await agent.start()
        # Passes every server check (the controller's own credential publishes it) but names a
        # controller the lease does not: a forger's term must not become the host's fence.
        forged = make_command(kind="drain", host_id=HOST, term=1_000_000_000, controller_id="ctl-forger")
        await controller_log.append(forged)
        ack = await wait_ack(controller_log, forged.action_id)
        assert ack.status == "rejected" and REASON_NOT_LEASE_HOLDER in ack.message, ack
        assert agent.state.highest_term == 0
        # The lease holder's command, same shape, is obeyed and moves the fence.
        real = make_command(kind="drain", host_id=HOST, term=TERM, controller_id=CONTROLLER)
        await controller_log.append(real)
        ack = await wait_ack(controller_log, real.action_id)
        assert ack.status != "rejected", ack
        assert agent.state.highest_term == TERM
    finally:
        await agent.stop(drain=True)
        await agent_log.close()


async def test_the_agent_renews_its_credential_before_it_expires(
    tmp_path: Path, secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog,
    authority: Authority,
) -> None:
    host_id = "renewing-host"
    # Issued 50 s ago for 60 s: past two thirds of its life, so renewal is due at once.
    host_creds = creds(Role.HOST, host_id=host_id, ttl=60.0, now=time.time() - 50.0)
    old_exp = jwt.decode(read_creds(host_creds)[0])["exp"]
    await provision_host_consumer(controller_log, authority.host_principal(host_id))
    service = EnrolmentService(authority, InvitationStore(tmp_path / "invitations.json"),
                               sign=controller_log.authorship.sign)  # type: ignore[union-attr]
    await service.serve(controller_log.client)
    agent_log = await connect_log(secured_server.url, credentials=host_creds, name="grid-agent",
                                  ensure_streams=False)
    agent = HostAgent(agent_log, GridConfig(home=tmp_path / "home", nats_url=None),
                      AgentOptions(host_id=host_id, credentials=host_creds, port_range=engine_ports()),
                      sensor_source=FixedSensors())
    try:
        await agent.start()
        deadline = time.monotonic() + 10
        while jwt.decode(read_creds(host_creds)[0])["exp"] == old_exp and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        new_exp = jwt.decode(read_creds(host_creds)[0])["exp"]
        assert new_exp > old_exp + 3600, "the agent did not renew its credential"
        assert (host_creds.stat().st_mode & 0o777) == 0o600
    finally:
        await agent.stop(drain=True)
        await agent_log.close()
        await service.stop()
