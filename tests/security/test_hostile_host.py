"""An enrolled but hostile host (and the other credentials) against a real secured grid.

Each test reproduces one vector a black-box probe used to take over the control plane without a
single permissions violation, and proves it now either is refused by the server or appends
bytes that every fold rejects: nothing executed, no mode, override, plan or status change, and
the rejection counted by reason. "Landed anyway" tests put the attacker's bytes on the target
subject through a connection that may publish there (as a reflection, or a future permission
mistake, would) to prove the folds and the agent do not depend on the server keeping them out.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from grid.agent.fencing import REASON_NOT_LEASE_SIGNER
from grid.agent.sensors import FixedSensors
from grid.agent.service import AgentOptions, HostAgent
from grid.config import GridConfig
from grid.controller.lease import LEASE_KEY, LeaseRecord, encode_record
from grid.events import codec
from grid.events.base import new_event_id
from grid.events.control import CredentialRevoked, HostOverride, ModelProfile, ModeSet, ProfileSet
from grid.events.host import HostHeartbeat, HostResources, Residency
from grid.events.jetstream import JetStreamLog
from grid.events.subjects import (
    CONTROL_STREAM,
    HOSTS_STREAM,
    LEASE_BUCKET,
    MODE_SUBJECT,
    command_subject,
    host_subject,
    override_subject,
    subject_for,
)
from grid.gateway import routing
from grid.gateway import state as gateway_state
from grid.identity.authority import Authority
from grid.identity.connect import connect_log
from grid.identity.permissions import Role
from grid.identity.provision import provision_host_consumer
from grid.identity.signing import BAD_SIGNATURE, NOT_PERMITTED, REVOKED_SIGNER, UNSIGNED, Identity
from grid.metrics import exposition
from grid.projections.runner import CORE_PROJECTIONS, ProjectionRunner
from tests.integration.agent.agentkit import make_command, terminal_acks, wait_ack, wait_for
from tests.integration.controller.statuskit import serving_controller, status_until
from tests.placement import warm_ack
from tests.security.conftest import CredsFactory, SecuredNats, event, raw_client, stream_sequences

EVIL = "evil-host"
VICTIM = "victim-host"
CONTROLLER = "ctl-real"
TERM = 3


async def fold(log: JetStreamLog) -> ProjectionRunner:
    """The controller's projections, folded from the log as the controller would."""
    runner = ProjectionRunner(CORE_PROJECTIONS)
    await runner.catch_up(log)
    return runner


async def landed(log: JetStreamLog, subject: str, data: bytes, headers: dict[str, str] | None) -> None:
    """Put exactly these bytes and headers on `subject`, as a reflection would have."""
    own, log.authorship = log.authorship, None
    try:
        await log.append_raw(subject, data, msg_id=new_event_id(), headers=headers)
    finally:
        log.authorship = own


async def settle(nc: object) -> None:
    await nc.flush()  # type: ignore[attr-defined]
    await asyncio.sleep(0.5)  # the server's reply to a reflected request is asynchronous


@pytest.fixture
async def evil(creds: CredsFactory) -> Identity:
    return Identity.from_creds(creds(Role.HOST, host_id=EVIL))


async def test_a_reflected_mode_change_and_override_change_nothing(
    secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog, evil: Identity
) -> None:
    """Vector 1: the host stores a ModeSet and a HostOverride on its own subject and asks the
    server to deliver them to `grid.ctl.*` as the reply of a direct get of its own events."""
    await controller_log.append(ModeSet(event_id=new_event_id(), at=time.time(), mode="automatic"))
    mode = ModeSet(event_id=new_event_id(), at=time.time(), mode="observe")
    override = HostOverride(event_id=new_event_id(), at=time.time(), host_id=VICTIM, state="quarantined")
    nc = await raw_client(secured_server, creds(Role.HOST, host_id=EVIL))
    before = await stream_sequences(controller_log)
    try:
        for forged, target in ((mode, MODE_SUBJECT), (override, override_subject(VICTIM))):
            own = host_subject(EVIL, f"x{forged.event_id[:8]}")
            data = codec.encode(forged)
            # Signed by the host for its own subject, and signed by it for the target itself.
            await nc.publish(own, data, headers=evil.sign(own, data))
            await nc.publish(f"$JS.API.DIRECT.GET.{HOSTS_STREAM}.{own}", b"", reply=target)
            await nc.publish(f"$JS.API.STREAM.MSG.GET.{HOSTS_STREAM}", msgspec.json.encode({"last_by_subj": own}),
                             reply=target)
        await settle(nc)
    finally:
        await nc.close()
    after = await stream_sequences(controller_log)
    runner = await fold(controller_log)
    assert runner["catalog"].mode == "automatic"
    victim = runner["fleet"].hosts.get(VICTIM)
    assert victim is None or victim.override is None
    # Whatever the server still stored on the control stream, the fold rejected or could not
    # even decode (a message-get reply is a JSON API envelope, never an event).
    stored = after[CONTROL_STREAM] - before[CONTROL_STREAM]
    assert runner.gate.rejected_total + runner.malformed >= stored


async def test_forged_control_events_that_land_are_rejected_by_reason(
    controller_log: JetStreamLog, evil: Identity
) -> None:
    """The same events on the control stream, however they got there: the host's signature for
    its own subject fails on another (a reflection), its signature for the target names a host,
    which may not write control events, and bytes without a signature prove nothing."""
    await controller_log.append(ModeSet(event_id=new_event_id(), at=time.time(), mode="automatic"))
    forged = codec.encode(ModeSet(event_id=new_event_id(), at=time.time(), mode="observe"))
    quarantine = HostOverride(event_id=new_event_id(), at=time.time(), host_id=VICTIM, state="quarantined")
    await landed(controller_log, MODE_SUBJECT, forged, evil.sign(host_subject(EVIL, "x"), forged))
    await landed(controller_log, MODE_SUBJECT, forged, evil.sign(MODE_SUBJECT, forged))
    await landed(controller_log, MODE_SUBJECT, forged, None)
    data = codec.encode(quarantine)
    await landed(controller_log, subject_for(quarantine), data, evil.sign(subject_for(quarantine), data))
    runner = await fold(controller_log)
    assert runner["catalog"].mode == "automatic"
    assert runner.rejected == {BAD_SIGNATURE: 1, NOT_PERMITTED: 2, UNSIGNED: 1}
    assert {r.subject for r in runner.gate.rejections} == {MODE_SUBJECT, subject_for(quarantine)}
    assert all(r.role in ("host", "") for r in runner.gate.rejections)


async def test_a_heartbeat_naming_another_host_never_becomes_that_hosts_state(
    controller_log: JetStreamLog, creds: CredsFactory, evil: Identity
) -> None:
    victim = Identity.from_creds(creds(Role.HOST, host_id=VICTIM))
    honest = event("host.heartbeat.v1", host_id=VICTIM)
    data = codec.encode(honest)
    subject = host_subject(VICTIM, "heartbeat")
    await landed(controller_log, subject, data, victim.sign(subject, data))
    forged = codec.encode(event("host.heartbeat.v1", host_id=VICTIM, residencies=()))
    await landed(controller_log, subject, forged, evil.sign(host_subject(EVIL, "heartbeat"), forged))
    await landed(controller_log, subject, forged, evil.sign(subject, forged))
    runner = await fold(controller_log)
    assert runner["fleet"].hosts[VICTIM].heartbeat == honest
    assert runner.rejected == {BAD_SIGNATURE: 1, NOT_PERMITTED: 1}


async def test_a_signature_replayed_on_another_subject_is_rejected(
    controller_log: JetStreamLog, creds: CredsFactory
) -> None:
    """A controller-signed plan or command copied, headers and all, onto another subject."""
    command = make_command(kind="unload", host_id="h1")
    data = codec.encode(command)
    headers = controller_log.authorship.sign(command_subject("h1"), data)  # type: ignore[union-attr]
    await landed(controller_log, command_subject("h1"), data, headers)
    await landed(controller_log, MODE_SUBJECT, data, headers)
    await landed(controller_log, command_subject("h2"), data, headers)
    runner = await fold(controller_log)
    assert runner.rejected == {BAD_SIGNATURE: 2}


async def test_a_revoked_hosts_old_signed_heartbeat_is_rejected_after_the_revocation(
    controller_log: JetStreamLog, creds: CredsFactory
) -> None:
    host = Identity.from_creds(creds(Role.HOST, host_id="lost-laptop"))
    first = event("host.heartbeat.v1", host_id="lost-laptop")
    subject = host_subject("lost-laptop", "heartbeat")
    data = codec.encode(first)
    headers = host.sign(subject, data)
    await landed(controller_log, subject, data, headers)
    await controller_log.append(CredentialRevoked(event_id=new_event_id(), at=time.time(), host_id="lost-laptop",
                                                  keys=(host.public_key,), reason="stolen"))
    later = codec.encode(event("host.heartbeat.v1", host_id="lost-laptop", residencies=()))
    await landed(controller_log, subject, later, host.sign(subject, later))
    await landed(controller_log, subject, data, headers)  # the old message, published again
    runner = await fold(controller_log)
    assert runner.rejected == {REVOKED_SIGNER: 2}
    assert runner["fleet"].hosts["lost-laptop"].heartbeat == first


@pytest.fixture
async def victim_agent(tmp_path: Path, secured_server: SecuredNats, creds: CredsFactory,
                       controller_log: JetStreamLog, authority: Authority):  # type: ignore[no-untyped-def]
    record = LeaseRecord(controller_id=CONTROLLER, term=TERM, ttl_seconds=60.0, renewed_at=time.time())
    await controller_log.kv_put(LEASE_BUCKET, LEASE_KEY, encode_record(record, controller_log.authorship))
    host_creds = creds(Role.HOST, host_id=VICTIM)
    await provision_host_consumer(controller_log, authority.host_principal(VICTIM))
    agent_log = await connect_log(secured_server.url, credentials=host_creds, name="grid-agent", ensure_streams=False)
    agent = HostAgent(agent_log, GridConfig(home=tmp_path / "home", nats_url=None),
                      AgentOptions(host_id=VICTIM, credentials=host_creds, heartbeat_interval=0.3,
                                   sample_interval=0.1, port_range=(39400, 39499)),
                      sensor_source=FixedSensors())
    await agent.start()
    try:
        yield agent
    finally:
        await agent.stop(drain=True)
        await agent_log.close()


async def test_forged_commands_with_the_real_controller_id_and_term_are_never_executed(
    victim_agent: HostAgent, controller_log: JetStreamLog, creds: CredsFactory, evil: Identity,
    secured_server: SecuredNats,
) -> None:
    """Vector 1's commands: drain and unload on the victim's queue, the lease's controller id and
    term copied (a host may read the lease). Unsigned, host-signed, or a real signature copied
    from another host's command: nothing runs, nothing is acknowledged, the fence stays."""
    forged = [make_command(kind=kind, host_id=VICTIM, term=TERM, controller_id=CONTROLLER)
              for kind in ("drain", "unload", "drain")]
    subject = command_subject(VICTIM)
    await landed(controller_log, subject, codec.encode(forged[0]), None)
    await landed(controller_log, subject, codec.encode(forged[1]), evil.sign(subject, codec.encode(forged[1])))
    elsewhere = codec.encode(forged[2])
    await landed(controller_log, subject, elsewhere,
                 controller_log.authorship.sign(command_subject("other-host"), elsewhere))  # type: ignore[union-attr]
    async def all_three_refused() -> bool | None:
        return sum(victim_agent.unproven_commands.values()) >= 3 or None

    await wait_for(all_three_refused, timeout=20)
    assert victim_agent.unproven_commands == {UNSIGNED: 1, NOT_PERMITTED: 1, BAD_SIGNATURE: 1}
    # Another controller credential of this grid, valid signature, copied id and term: refused,
    # because the lease holder's own key must sign (and the fence does not move).
    other = await connect_log(secured_server.url, credentials=creds(Role.CONTROLLER), name="grid-controller-2",
                              ensure_streams=False)
    try:
        impostor = make_command(kind="drain", host_id=VICTIM, term=TERM, controller_id=CONTROLLER)
        await other.append(impostor)
    finally:
        await other.close()
    ack = await wait_ack(controller_log, impostor.action_id)
    assert ack.status == "rejected" and REASON_NOT_LEASE_SIGNER in ack.message, ack
    assert victim_agent.state.highest_term == 0
    for command in forged:
        assert await terminal_acks(controller_log, command.action_id) == []
    # The lease holder's own command, same shape, runs.
    real = make_command(kind="drain", host_id=VICTIM, term=TERM, controller_id=CONTROLLER)
    await controller_log.append(real)
    ack = await wait_ack(controller_log, real.action_id)
    assert ack.status != "rejected", ack
    assert victim_agent.state.highest_term == TERM



async def test_every_rejection_shows_in_status_and_metrics(controller_log: JetStreamLog, evil: Identity,
                                                            tmp_path: Path) -> None:
    """A real controller on the secured grid: the forgeries change nothing and are counted."""
    await controller_log.append(ModeSet(event_id=new_event_id(), at=time.time(), mode="automatic"))
    forged = codec.encode(ModeSet(event_id=new_event_id(), at=time.time(), mode="observe"))
    await landed(controller_log, MODE_SUBJECT, forged, evil.sign(MODE_SUBJECT, forged))
    await landed(controller_log, MODE_SUBJECT, forged, evil.sign(host_subject(EVIL, "x"), forged))
    await landed(controller_log, MODE_SUBJECT, forged, None)
    home = tmp_path / "home"

    async def nothing() -> None:
        return None

    async with serving_controller(controller_log, home, "ctl-hostile") as ctl:
        doc = await status_until(home, nothing, lambda d: d["rejected_events"]["total"] >= 3, "the rejections")
        assert doc["rejected_events"]["by_reason"] == {NOT_PERMITTED: 1, BAD_SIGNATURE: 1, UNSIGNED: 1}
        assert all(r["subject"] == MODE_SUBJECT for r in doc["rejected_events"]["latest"])
        assert any(w.startswith("3 events rejected") for w in doc["warnings"]), doc["warnings"]
        assert ctl.runner["catalog"].mode == "automatic"
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in text_string_to_metric_families(exposition(ctl.metrics.registry).decode())
                   for s in f.samples}
        for reason in (NOT_PERMITTED, BAD_SIGNATURE, UNSIGNED):
            assert samples[("grid_events_rejected_total", (("reason", reason),))] == 1


async def test_a_claimed_residency_with_a_self_made_warm_ack_attracts_no_prompt(
    secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog, tmp_path: Path
) -> None:
    """Vector 3: the host heartbeats `ready, managed, <the real digest>` for a model nobody placed
    on it, and signs a succeeded warm ack of its own making. A real controller neither counts it as
    a replica (it never commanded one there) nor lists it as corroborated, so its plan keeps the
    honest replica, the real gateway routes only the honest host, and status lists the claim."""
    sha = "ab" * 32
    model = "smollm2"
    await controller_log.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=ModelProfile(
        model_id=model, memory_mb=300, artifact_sha256=sha, min_replicas=1)))
    logs = {host: await connect_log(secured_server.url, name=f"grid-agent-{host}", ensure_streams=False,
                                    credentials=creds(Role.HOST, host_id=host)) for host in ("honest-host", EVIL)}
    warm = make_command(kind="warm", host_id="honest-host", model_id=model, term=1, controller_id="ctl-hostile")
    await controller_log.append(warm)
    await logs["honest-host"].append(warm_ack("honest-host", model, action_id=warm.action_id))
    await logs[EVIL].append(warm_ack(EVIL, model, action_id="warm-nobody-issued"))

    async def heartbeats() -> None:
        for host, log in logs.items():
            claim = Residency(model_id=model, memory_mb=300, state="ready", endpoint=f"http://{host}:1",
                              max_concurrency=4, artifact_sha256=sha)
            await log.append(HostHeartbeat(event_id=new_event_id(), at=time.time(), host_id=host,
                                           resources=HostResources(capacity_mb=16000), residencies=(claim,)))

    home = tmp_path / "home"
    gw = None
    try:
        async with serving_controller(controller_log, home, "ctl-hostile"):
            doc = await status_until(home, heartbeats, lambda d: [
                c["host_id"] for c in d["unplaced_claims"]] == [EVIL] and d["plan"] is not None, "the evil claim")
            # Not even an incumbent: counted as one, it could make the plan drop the honest replica.
            assert doc["unplaced_claims"][0]["reason"] == "not_in_plan", doc["unplaced_claims"]
            assert [(p["host_id"], p["model_id"]) for p in doc["plan"]["placements"]] == [("honest-host", model)]
            gateway_log = await connect_log(secured_server.url, name="grid-gateway", credentials=creds(Role.GATEWAY),
                                            ensure_streams=False)
            gw = gateway_state.Gateway(gateway_log, GridConfig(home=tmp_path / "gw", nats_url=None), api_keys=[])
            await gw.start()

            async def routed() -> dict[str, str | None] | None:
                await heartbeats()
                now = time.time()
                table = {c.host_id: routing.exclusion(c, now) for c in gw.table(now).get(model, ())}  # type: ignore[union-attr]
                return table if table.get("honest-host", "x") is None else None

            table = await wait_for(routed, timeout=20)
            assert table == {"honest-host": None, EVIL: routing.EXCLUDED_UNPLACED}
            assert gw.runner.rejected == {}
    finally:
        if gw is not None:
            await gw.stop()
            await gw.log.close()
        for log in logs.values():
            await log.close()
