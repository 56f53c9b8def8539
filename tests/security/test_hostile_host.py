"""An enrolled but hostile host (and the other credentials) against a real secured grid.

A black-box probe took over the control plane with legitimate credentials and not one
permissions violation. Each of its vectors is reproduced here with real clients against a
nats-server in operator mode, in two parts:

- What lands is worthless: forged or reflected events on the control, host and command subjects
  are rejected by every fold by reason (and shown in status and metrics), commands not signed by
  the lease holder's key are never executed, a revoked key's old signature is refused from the
  revocation on, and a claimed residency nobody commanded attracts no prompt and displaces no
  replica. "Landed anyway" tests put the attacker's bytes on the target subject through a
  connection that may publish there (as a reflection, or a future permission mistake, would) to
  prove the folds and the agent do not depend on the server keeping them out.
- The server refuses it anyway (defence in depth): no direct gets but the controller's, services
  answer only under the requester's own inbox, consumers on GRID_CMDS are the controller's alone,
  and the invitee credential dies with its join. Next to each, the honest path it closed still
  works.

The probe's two other findings have their own files: `gridctl replay` over a window holding
forged events succeeds and lists them (tests/security/test_replay_rejections.py), and everything
under GRID_HOME is owner-only (tests/security/test_home_modes.py).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import nats
import nkeys
import pytest
from prometheus_client.parser import text_string_to_metric_families

from grid.agent.artifact_fetch import GridArtifactSource
from grid.agent.artifacts import ArtifactCache
from grid.agent.fencing import REASON_NOT_LEASE_SIGNER
from grid.agent.sensors import FixedSensors
from grid.agent.service import AgentOptions, HostAgent
from grid.config import GridConfig
from grid.events import codec
from grid.events.base import new_event_id
from grid.events.control import CredentialRevoked, ForecastWindowSet, HostOverride, ModelProfile, ModeSet, ProfileSet
from grid.events.host import HostHeartbeat, HostResources, Residency
from grid.events.lease import LEASE_KEY, LeaseRecord, encode_record
from grid.events.subjects import (
    ARTIFACT_BUCKET,
    ARTIFACT_STREAM,
    COMMANDS_STREAM,
    COMMANDS_VIEW_STREAM,
    CONTROL_STREAM,
    FORECAST_WINDOW_SUBJECT,
    HOSTS_STREAM,
    LEASE_BUCKET,
    MODE_SUBJECT,
    PLAN_SUBJECT,
    command_subject,
    host_subject,
    infer_request_subject,
    override_subject,
    subject_for,
)
from grid.controller.tick import DEMAND
from grid.gateway import routing, state as gateway_state
from grid.identity import jwt
from grid.identity.authority import Authority
from grid.identity.connect import connect_log
from grid.identity.creds import credential_principal, read_creds
from grid.identity.enrolment import Enrolment, EnrolmentService, JoinRequest, join, join_statement, renew
from grid.identity.invitations import InvitationStore
from grid.identity.permissions import ENROL_JOIN_SUBJECT, ENROL_RENEW_SUBJECT, IMPORTED_JS_PREFIX, Role, inbox_prefix, local_subject
from grid.identity.provision import provision_host_consumer
from grid.identity.signing import BAD_SIGNATURE, NOT_PERMITTED, REVOKED_SIGNER, UNSIGNED, Identity, Signer
from grid.infer import wire
from grid.infer.client import InferTarget, NatsUpstream
from grid.infer.responder import EngineRoute, InferenceResponder
from grid.metrics import exposition
from grid.projections.runner import CORE_PROJECTIONS, ProjectionRunner
from grid.transport.artifact_store import (
    ARTIFACT_CHUNK_SIZE,
    put_artifact,
    stored_artifact,
)
from grid.transport.jetstream import JetStreamLog
from tests.artifact_store import fresh_artifact_bucket
from tests.integration.agent.agentkit import make_command, terminal_acks, wait_ack, wait_for
from tests.integration.controller.statuskit import serving_controller, status_until
from tests.placement import warm_ack
from tests.ports import engine_ports
from tests.security.test_enrolment import refused_at_connect, revocations_counted
from tests.security.conftest import (
    CredsFactory,
    SecuredNats,
    event,
    infer_client,
    invitee_client,
    raw_client,
    stream_sequences,
)

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


async def test_a_host_cannot_change_the_forecast_window(
    controller_log: JetStreamLog, secured_server: SecuredNats, creds: CredsFactory, evil: Identity
) -> None:
    """The forecast window decides how fast demand moves models (a 1 s bucket turns one request
    into a minute of evidence), so it is an operator decision: a host can neither publish it nor
    get a copy that landed on the control stream past the fold."""
    await controller_log.append(ForecastWindowSet(event_id=new_event_id(), at=time.time(), bucket_seconds=30.0))
    nc = await raw_client(secured_server, creds(Role.HOST, host_id=EVIL))
    before = await stream_sequences(controller_log)
    forged = codec.encode(ForecastWindowSet(event_id=new_event_id(), at=time.time(), bucket_seconds=1.0))
    try:
        await nc.publish(FORECAST_WINDOW_SUBJECT, forged, headers=evil.sign(FORECAST_WINDOW_SUBJECT, forged))
        await permission_error(nc, FORECAST_WINDOW_SUBJECT)
    finally:
        await nc.close()
    assert await stream_sequences(controller_log) == before
    # However the bytes got there: signed by the host for its own subject, for the target, unsigned.
    await landed(controller_log, FORECAST_WINDOW_SUBJECT, forged, evil.sign(host_subject(EVIL, "x"), forged))
    await landed(controller_log, FORECAST_WINDOW_SUBJECT, forged, evil.sign(FORECAST_WINDOW_SUBJECT, forged))
    await landed(controller_log, FORECAST_WINDOW_SUBJECT, forged, None)
    runner = ProjectionRunner((*CORE_PROJECTIONS, DEMAND))
    await runner.catch_up(controller_log)
    assert runner["demand"].bucket_seconds == 30.0
    assert runner.rejected == {BAD_SIGNATURE: 1, NOT_PERMITTED: 1, UNSIGNED: 1}


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
                                   sample_interval=0.1, port_range=engine_ports()),
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


# ================================================================ the server refuses it anyway
HOST = "node-1"
OTHER = "node-2"
MODEL = "tiny"
# How long a refused request is given to produce something anyway before we call it silent.
SILENCE_SECONDS = 1.0
REFUSAL_WAIT_SECONDS = 3.0


async def permission_error(nc: nats.NATS, subject: str) -> str:
    """The server's permissions violation for a publish to `subject` (fails if none comes)."""
    errors: list[Exception] = nc.permission_errors  # type: ignore[attr-defined]
    wanted = f'permissions violation for publish to "{subject}"'.lower()
    deadline = time.monotonic() + REFUSAL_WAIT_SECONDS
    while time.monotonic() < deadline:
        for exc in errors:
            if wanted in str(exc).lower():
                return str(exc)
        await asyncio.sleep(0.02)
    raise AssertionError(f"no permission error for a publish to {subject}; saw {errors}")


async def reflect(nc: nats.NATS, subject: str, body: bytes, reply: str) -> None:
    await nc.publish(subject, body, reply=reply)
    await nc.flush()


# ---------------------------------------------------------------- 1. reply-subject reflection

@pytest.mark.parametrize("target", ["grid.ctl.mode", PLAN_SUBJECT, f"grid.cmd.{HOST}", f"grid.host.{OTHER}.heartbeat"])
async def test_a_host_direct_get_aimed_at_a_stream_subject_is_refused(
    target: str, secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog,
) -> None:
    await controller_log.kv_put(LEASE_BUCKET, "controller", b"term-1")
    host_creds = creds(Role.HOST, host_id=HOST)
    host = await connect_log(secured_server.url, credentials=host_creds, ensure_streams=False)
    nc = await raw_client(secured_server, host_creds)
    try:
        await host.append(event("host.heartbeat.v1", host_id=HOST))
        before = await stream_sequences(controller_log)
        for subject in (f"$JS.API.DIRECT.GET.{HOSTS_STREAM}.{host_subject(HOST, 'heartbeat')}",
                        f"$JS.API.DIRECT.GET.KV_{LEASE_BUCKET}.$KV.{LEASE_BUCKET}.controller"):
            await reflect(nc, subject, b"", target)
            await permission_error(nc, subject)
        await asyncio.sleep(0.2)
        assert await stream_sequences(controller_log) == before
        # What the direct gets were for still works, through stream message gets.
        mine = await host.last_message(host_subject(HOST, "heartbeat"))
        assert mine is not None and mine.seq == before[HOSTS_STREAM]
        lease = await host.kv_get(LEASE_BUCKET, "controller")
        assert lease is not None and lease.value == b"term-1"
    finally:
        await nc.close()
        await host.close()


async def test_a_host_account_imports_no_direct_get(
    secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog,
) -> None:
    """The streams answer direct gets (gateways, operators and readers read with them from their
    own accounts), but a host's account imports none: under its prefix nobody answers."""
    await controller_log.append(event("host.heartbeat.v1", host_id=HOST))
    nc = await raw_client(secured_server, creds(Role.HOST, host_id=HOST))
    try:
        for stream in (HOSTS_STREAM, CONTROL_STREAM):
            with pytest.raises((nats.errors.NoRespondersError, nats.errors.TimeoutError)):
                await nc.request(local_subject(f"$JS.API.DIRECT.GET.{stream}"), b'{"seq": 1}', timeout=1)
    finally:
        await nc.close()


@pytest.fixture
async def artifact(controller_log: JetStreamLog, tmp_path: Path) -> AsyncIterator[tuple[Path, str]]:
    await fresh_artifact_bucket(controller_log)
    data = os.urandom(2 * ARTIFACT_CHUNK_SIZE + 777)
    path = tmp_path / "blob.gguf"
    path.write_bytes(data)
    yield path, hashlib.sha256(data).hexdigest()


async def test_the_operator_cannot_reflect_the_artifact_store_but_still_pushes_and_reads(
    artifact: tuple[Path, str], secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog,
    tmp_path: Path,
) -> None:
    path, sha = artifact
    operator = await raw_client(secured_server, creds(Role.OPERATOR))
    host = await raw_client(secured_server, creds(Role.HOST, host_id=HOST))
    try:
        await put_artifact(operator.jetstream(prefix=IMPORTED_JS_PREFIX), path, sha)  # gridctl model push
        stored = await stored_artifact(operator.jetstream(prefix=IMPORTED_JS_PREFIX), sha)
        assert stored is not None and stored.digest_matches and stored.chunks == 3
        before = await stream_sequences(controller_log)
        for nc in (operator, host):
            for subject, body in ((f"$JS.API.DIRECT.GET.{ARTIFACT_STREAM}", b'{"seq": 1}'),
                                  (f"$JS.API.DIRECT.GET.{ARTIFACT_STREAM}.$O.{ARTIFACT_BUCKET}.M.x", b"")):
                await reflect(nc, subject, body, "grid.ctl.mode")
                await permission_error(nc, subject)
        await asyncio.sleep(0.2)
        assert await stream_sequences(controller_log) == before
        # A host still fetches it (a load from the grid): message gets into its cache.
        cache = ArtifactCache(tmp_path / "artifacts")
        outcome = await GridArtifactSource(host.jetstream(prefix=IMPORTED_JS_PREFIX)).fetch(cache, sha, None, model_id="m")
        assert outcome.ok, outcome
        assert Path(outcome.path).read_bytes() == path.read_bytes()  # type: ignore[arg-type]
    finally:
        await operator.close()
        await host.close()


# ---------------------------------------------------------------- 2. services' reply subjects

class _Engine:
    """A loopback engine stand-in: answers every POST with one small JSON body."""

    def __init__(self) -> None:
        self.posts = 0

    async def post(self, url: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> "_Engine":
        self.posts += 1
        return self

    status_code = 200
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", b"11")]

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        yield b'{"ok":true}'

    async def aclose(self) -> None:
        pass


@pytest.fixture
async def agent_responder(secured_server: SecuredNats, creds: CredsFactory,
                          ) -> AsyncIterator[tuple[InferenceResponder, _Engine]]:
    """The host agent's inference responder on its own log's connection, as the agent runs it."""
    host = await connect_log(secured_server.url, credentials=creds(Role.HOST, host_id=HOST), ensure_streams=False)
    engine = _Engine()
    assert host.authorship is not None
    responder = InferenceResponder(host.client, HOST, lambda model: EngineRoute("http://127.0.0.1:1", "k"),
                                   engine_client=engine, verifier=host.authorship.verifier)  # type: ignore[attr-defined]
    await responder.start()
    try:
        yield responder, engine
    finally:
        await responder.stop()
        await host.close()


def _infer_headers() -> dict[str, str]:
    return {wire.H_PATH: "/v1/chat/completions", wire.H_MODEL: MODEL}


@pytest.mark.parametrize("target", ["grid.ctl.mode", PLAN_SUBJECT])
async def test_an_inference_request_with_a_stream_subject_as_reply_lands_nothing_in_the_log(
    target: str, agent_responder: tuple[InferenceResponder, _Engine], secured_server: SecuredNats,
    creds: CredsFactory, controller_log: JetStreamLog,
) -> None:
    """A request reaches a host across INFER's import of its service, so the host answers on a
    reply subject the server made up, mapped back into INFER, where no stream listens: a
    gateway's own signed request is served wherever it asked, and nothing lands in the log."""
    responder, engine = agent_responder
    gateway_creds = creds(Role.GATEWAY)
    gateway = await infer_client(secured_server, gateway_creds)
    signer = Identity.from_creds(gateway_creds)
    subject = infer_request_subject(HOST)
    body = b'{"messages":[]}'
    before = await stream_sequences(controller_log)
    try:
        # Unsigned, as the probe sent it; then signed by the gateway itself, reply still elsewhere.
        await gateway.publish(subject, body, reply=target, headers=_infer_headers())
        await gateway.publish(subject, body, reply=target, headers={**_infer_headers(), **signer.sign(subject, body)})
        # Signed, under another credential's inbox (the controller's, say).
        elsewhere = inbox_prefix(jwt.decode(read_creds(creds(Role.CONTROLLER))[0])["sub"]) + ".x"
        await gateway.publish(subject, body, reply=elsewhere, headers={**_infer_headers(), **signer.sign(subject, body)})
        await gateway.flush()
        await asyncio.sleep(SILENCE_SECONDS)
    finally:
        await gateway.close()
    assert responder.refused == {UNSIGNED: 1}
    assert engine.posts == responder.served == 2
    assert await stream_sequences(controller_log) == before


async def test_a_host_cannot_make_another_host_serve(
    agent_responder: tuple[InferenceResponder, _Engine], secured_server: SecuredNats, creds: CredsFactory,
) -> None:
    """The server refuses a host's request outright; and a host's signature on a request that
    reached the agent some other way (here: carried by a gateway) is not honoured."""
    responder, engine = agent_responder
    other_creds = creds(Role.HOST, host_id=OTHER)
    other = await raw_client(secured_server, other_creds)
    subject = infer_request_subject(HOST)
    body = b"{}"
    try:
        await other.publish(subject, body, reply=other.new_inbox(), headers=_infer_headers())
        await other.flush()
        await permission_error(other, subject)
    finally:
        await other.close()
    gateway = await infer_client(secured_server, creds(Role.GATEWAY))
    try:
        signed_by_host = Identity.from_creds(other_creds).sign(subject, body)
        await gateway.publish(subject, body, reply=gateway.new_inbox(), headers={**_infer_headers(),
                                                                                 **signed_by_host})
        await gateway.flush()
        await asyncio.sleep(SILENCE_SECONDS)
    finally:
        await gateway.close()
    assert responder.refused == {NOT_PERMITTED: 1} and engine.posts == 0


async def test_the_gateway_still_reaches_the_agent_through_its_own_inbox(
    agent_responder: tuple[InferenceResponder, _Engine], secured_server: SecuredNats, creds: CredsFactory,
    controller_log: JetStreamLog,
) -> None:
    responder, engine = agent_responder
    gateway = await connect_log(secured_server.url, credentials=creds(Role.GATEWAY), ensure_streams=False)
    inference = await gateway.infer_connector()  # type: ignore[attr-defined]
    upstream = NatsUpstream(inference.client, connect_timeout=5.0, read_timeout=10.0, signer=gateway.authorship)
    before = await stream_sequences(controller_log)
    try:
        response = await upstream.post(InferTarget(HOST, MODEL, "/v1/chat/completions"), b'{"messages":[]}',
                                       [(b"content-type", b"application/json")])
        assert response.status_code == 200 and await response.aread() == b'{"ok":true}'
        await response.aclose()
    finally:
        await upstream.aclose()
        await inference.close()
        await gateway.close()
    assert responder.served == 1 and responder.refused == {} and engine.posts == 1
    assert await stream_sequences(controller_log) == before


async def test_an_unsecured_responder_answers_only_under_the_inbox_root() -> None:
    """Without identities there is no key to check, but a stream subject is still refused."""
    from grid.identity.replies import check_request

    assert check_request(None, "grid.infer.h.req", b"", None, "_INBOX.abc.1").ok
    for reply in ("grid.ctl.mode", "grid.plan", "_INBOXX.1", "", None):
        assert not check_request(None, "grid.infer.h.req", b"", None, reply).ok


@pytest.fixture
async def enrolment(secured_server: SecuredNats, authority: Authority, controller_log: JetStreamLog,
                    tmp_path: Path) -> AsyncIterator[EnrolmentService]:
    service = EnrolmentService(authority, InvitationStore(tmp_path / "invitations.json"),
                               on_admitted=lambda host: provision_host_consumer(controller_log, host),
                               sign=controller_log.authorship.sign)  # type: ignore[union-attr]
    await service.serve(controller_log.client)
    try:
        yield service
    finally:
        await service.stop()


async def test_an_enrolment_answer_aimed_at_a_stream_lands_only_in_the_invitees_account(
    enrolment: EnrolmentService, secured_server: SecuredNats, controller_log: JetStreamLog, tmp_path: Path,
) -> None:
    """An invitee's request crosses from its own account into GRID, so the service answers on a
    reply subject the server made up and maps back into INVITEE, where no stream listens."""
    _, token = enrolment.invite(HOST, servers=(secured_server.url,), tls_fingerprint=None)
    pair = nkeys.from_seed(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))
    public = pair.public_key.decode()
    request = JoinRequest(secret=token.secret, public_key=public, nonce="n",
                          signature=base64.b64encode(pair.sign(join_statement(token.secret, public, "n"))).decode())
    body = msgspec.json.encode(request)
    signed = Signer(token.invitee_jwt, token.invitee_seed).sign(ENROL_JOIN_SUBJECT, body)
    before = await stream_sequences(controller_log)
    invitee = await invitee_client(secured_server, token)
    try:
        for reply, headers in ((f"grid.cmd.{HOST}", None), ("grid.ctl.mode", signed)):
            await invitee.publish(ENROL_JOIN_SUBJECT, body, reply=reply, headers=headers)
        await invitee.flush()
        await asyncio.sleep(SILENCE_SECONDS)
        assert invitee.permission_errors == []  # type: ignore[attr-defined]
    finally:
        await invitee.close()
    assert enrolment.refused_requests == {UNSIGNED: 1}
    assert await stream_sequences(controller_log) == before


async def test_join_and_renew_work_and_the_invitee_credential_dies_with_its_join(
    enrolment: EnrolmentService, secured_server: SecuredNats, controller_log: JetStreamLog, tmp_path: Path,
) -> None:
    _, token = enrolment.invite(HOST, servers=(secured_server.url,), tls_fingerprint=None)
    joined = await join(token, tmp_path / "host-home")
    assert isinstance(joined, Enrolment)
    # The invitee is revoked once its join is answered: a second connect is refused.
    await refused_at_connect(secured_server, token)
    assert await revocations_counted(enrolment, 1) == 1
    # The host renews over its own connection; a renewal aimed at a stream subject is answered
    # in the host's own account, where no stream listens.
    creds_path = Path(joined.creds_path)
    host = await connect_log(secured_server.url, credentials=creds_path, ensure_streams=False)
    before = await stream_sequences(controller_log)
    try:
        current, seed = read_creds(creds_path)
        body = b"{}"
        await host.client.publish(ENROL_RENEW_SUBJECT, body, reply=f"grid.cmd.{HOST}",
                                  headers=Signer(current, seed).sign(ENROL_RENEW_SUBJECT, body))
        await host.client.flush()
        await asyncio.sleep(SILENCE_SECONDS)
        assert enrolment.refused_requests == {}
        expires_at = await renew(host.client, creds_path)
        assert isinstance(expires_at, float) and expires_at > time.time()
    finally:
        await host.close()
    assert await stream_sequences(controller_log) == before


# ---------------------------------------------------------------- 3. consumer re-pointing

@pytest.mark.parametrize("role", [Role.OPERATOR, Role.READER])
async def test_a_host_command_consumer_cannot_be_re_pointed_and_readers_still_replay_commands(
    role: Role, secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog,
    authority: Authority,
) -> None:
    host_creds = creds(Role.HOST, host_id=HOST)
    principal = credential_principal(host_creds)
    assert principal is not None and principal.command_consumer is not None
    await provision_host_consumer(controller_log, principal)
    command = event("command.issued.v1", host_id=HOST)
    await controller_log.append(command)
    js = controller_log.client.jetstream()
    reader_creds = creds(role, streams=(COMMANDS_STREAM,) if role is Role.READER else ())
    nc = await raw_client(secured_server, reader_creds)
    before = await stream_sequences(controller_log)
    try:
        for subject in (f"$JS.API.CONSUMER.CREATE.{COMMANDS_STREAM}",
                        f"$JS.API.CONSUMER.CREATE.{COMMANDS_STREAM}.{principal.command_consumer}.grid.cmd.nobody"):
            body = {"stream_name": COMMANDS_STREAM, "config": {
                "name": principal.command_consumer, "filter_subject": "grid.cmd.nobody", "ack_policy": "explicit",
                "deliver_policy": "all"}}
            await reflect(nc, subject, json.dumps(body).encode(), nc.new_inbox())
            await permission_error(nc, subject)
    finally:
        await nc.close()
    info = await js.consumer_info(COMMANDS_STREAM, principal.command_consumer)
    assert info.config.filter_subject == command_subject(HOST) and info.num_pending == 1

    # The reader replays and tails commands through the mirror, at once after they were written.
    reader = await connect_log(secured_server.url, credentials=reader_creds, ensure_streams=False)
    try:
        assert reader.views == {COMMANDS_STREAM: COMMANDS_VIEW_STREAM}
        replayed = [m async for m in reader.replay(COMMANDS_STREAM)]
        assert [(m.stream, m.seq, m.msg_id) for m in replayed] == [(COMMANDS_STREAM, 1, command.event_id)]
        live = await reader.subscribe(COMMANDS_STREAM)
        second = event("command.issued.v1", host_id=HOST)
        await controller_log.append(second)
        got = await live.next(timeout=5)
        assert got is not None and (got.stream, got.seq, got.msg_id) == (COMMANDS_STREAM, 2, second.event_id)
        await live.close()
    finally:
        await reader.close()
    assert await stream_sequences(controller_log) == {**before, COMMANDS_STREAM: 2}

    # The agent still consumes its own commands through its consumer.
    host = await connect_log(secured_server.url, credentials=host_creds, ensure_streams=False)
    try:
        sub = await host.subscribe(COMMANDS_STREAM, durable=principal.command_consumer,
                                   subject_filter=command_subject(HOST))
        for wanted in (command, second):
            got = await sub.next(timeout=5)
            assert got is not None and got.msg_id == wanted.event_id
            await sub.ack(got)
        await sub.close()
    finally:
        await host.close()


async def test_the_controller_reads_commands_from_the_stream_itself(controller_log: JetStreamLog) -> None:
    """Read-your-writes for the one writer of commands: no mirror in between."""
    assert controller_log.views == {}
    command = event("command.issued.v1", host_id=HOST)
    await controller_log.append(command)
    assert [m.msg_id async for m in controller_log.replay(COMMANDS_STREAM)] == [command.event_id]


async def test_the_mirror_follows_a_commands_stream_made_anew(controller_log: JetStreamLog) -> None:
    """Sequences in the mirror are GRID_CMDS's: when GRID_CMDS is made anew the mirror is too."""
    js = controller_log.client.jetstream()
    await controller_log.append(event("command.issued.v1", host_id=HOST))
    await controller_log.append(event("command.issued.v1", host_id=HOST))
    for _ in range(100):
        if (await js.stream_info(COMMANDS_VIEW_STREAM)).state.last_seq == 2:
            break
        await asyncio.sleep(0.05)
    await js.delete_stream(COMMANDS_STREAM)
    for attempt in range(50):
        try:
            await controller_log.ensure_streams()
            break
        except Exception:  # the server removes a deleted stream's files asynchronously
            await asyncio.sleep(0.1)
    fresh = event("command.issued.v1", host_id=HOST)
    assert (await controller_log.append(fresh)).seq == 1
    for _ in range(100):
        view = await js.stream_info(COMMANDS_VIEW_STREAM)
        if view.state.last_seq >= 1:
            break
        await asyncio.sleep(0.05)
    assert (view.state.first_seq, view.state.last_seq) == (1, 1)
    assert (await js.get_msg(COMMANDS_VIEW_STREAM, 1)).headers["Nats-Msg-Id"] == fresh.event_id  # type: ignore[index]


def test_no_identity_but_the_controller_may_use_direct_gets_or_create_command_consumers() -> None:
    from grid.events.log import subject_matches
    from grid.identity.permissions import Principal, grant_for

    for role in Role:
        principal = Principal(role, host_id=HOST if role is Role.HOST else None,
                              command_consumer=f"agent-{HOST}-x" if role is Role.HOST else None,
                              streams=(COMMANDS_STREAM, HOSTS_STREAM) if role is Role.READER else ())
        grant = grant_for(principal, "UKEY")
        for subject in (f"$JS.API.DIRECT.GET.{HOSTS_STREAM}", f"$JS.API.DIRECT.GET.{ARTIFACT_STREAM}",
                        f"$JS.API.DIRECT.GET.KV_{LEASE_BUCKET}.$KV.{LEASE_BUCKET}.controller",
                        f"$JS.API.CONSUMER.CREATE.{COMMANDS_STREAM}",
                        f"$JS.API.CONSUMER.CREATE.{COMMANDS_STREAM}.agent-{HOST}-x.grid.cmd.{HOST}"):
            allowed = (any(subject_matches(p, subject) for p in grant.pub_allow)
                       and not any(subject_matches(p, subject) for p in grant.pub_deny))
            assert allowed == (role is Role.CONTROLLER), (role, subject)

