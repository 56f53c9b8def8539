"""One host's footprint is bounded; floods cost only the flooder (issue 36, Isolation).

Attacks with a legitimately enrolled but hostile host, reproduced against a real nats-server in
operator mode with real clients holding the host's real credential:

- it may publish only its exact subjects (a new subject under its own prefix is refused);
- a 1 MiB message is refused by the server (its JWT's payload limit), and an event over the
  hosts stream's max_msg_size is refused by the stream: nothing is stored either way;
- publishing on its own subjects far past what the hosts stream holds evicts only its own
  history: another host's registration and the control stream keep every message;
- a flood of its own valid signed heartbeats, or of unsigned junk, from a separate process
  as fast as one client can: a real controller keeps folding an honest host's heartbeats
  (their age in its fold stays within two heartbeat intervals), shows the flooder over its
  budget in status and metrics, and writes a bounded number of rejection log lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import nats
import nats.errors
import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families

from grid.events.base import new_event_id
from grid.events.control import ModeSet
from grid.events.log import LogError
from grid.events.subjects import (
    CONTROL_STREAM,
    HOST_EVENT_KINDS,
    HOSTS_STREAM,
    MODE_SUBJECT,
    host_subject,
    host_subjects,
    subject_for,
)
from grid.identity.authority import Authority
from grid.identity.connect import connect_log
from grid.identity.permissions import HOST_MAX_PAYLOAD, Role
from grid.controller.ingress import INGRESS_POLICIES, UNSIGNED
from grid.identity.service import ControllerIdentity
from grid.identity.signing import Signer
from grid.metrics import exposition
from grid.fleet.freshness import HEARTBEAT_TIMEOUT_SECONDS
from grid.projections.budget import HOST_BURST_MESSAGES, HOST_RATE_PER_SECOND, OVER_RATE
from grid.transport.jetstream import (
    HOST_EVENT_MAX_BYTES,
    HOST_SUBJECT_HISTORY,
    GIB,
    JetStreamLog,
    host_footprint_bytes,
    protected_hosts,
    stream_byte_limits,
)
from tests.integration.controller.statuskit import serving_controller
from tests.security.conftest import CredsFactory, SecuredNats, event, raw_client, stream_sequences
from tests.security.test_hostile_host import permission_error

FLOODER = "flooder"
HONEST = "honest"
INTERVAL = 1.0  # the honest host's heartbeat interval in these tests
FLOOD_SECONDS = 4.0
LOG_BUDGET = GIB
# Publishes the flooder keeps awaiting the stream's ack: as fast as the log stores them. (Fire and
# forget from one Python client is some 13 times what a server fsyncing every write stores here;
# the server then queues and drops it, honest heartbeats with it, before any reader sees a
# message: bench.hostile_flood measures that case.)
FLOOD_WINDOW = 256
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def secured_server(tmp_path_factory: pytest.TempPathFactory, authority: Authority) -> Iterator[SecuredNats]:
    """The module's secured server, as tests/security/conftest.py starts it but for fsync: on this
    machine's disk a server fsyncing every write stores some 5,000 messages a second, less than
    the readers fold, so a flood would test the disk, not the readers. Without it the server
    stores a flood as fast as one client sends (the regime of issue 36's deployment, whose
    server stored 5,400 msg/s while its controller fell minutes behind)."""
    server = SecuredNats(tmp_path_factory.mktemp("secured-nats"), authority, sync_always=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def _host_log(server: SecuredNats, creds: CredsFactory, host_id: str) -> JetStreamLog:
    return await connect_log(server.url, name=f"grid-agent-{host_id}", credentials=creds(Role.HOST, host_id=host_id),
                             ensure_streams=False)


async def _subject_counts(log: JetStreamLog, subject: str) -> int:
    info = await log.client.jetstream().stream_info(HOSTS_STREAM, subjects_filter=subject)
    return sum((info.state.subjects or {}).values())


# ---------------------------------------------------------------- exact subjects


async def test_a_host_may_publish_only_its_exact_subjects(
    controller_log: JetStreamLog, secured_server: SecuredNats, creds: CredsFactory
) -> None:
    nc = await raw_client(secured_server, creds(Role.HOST, host_id=FLOODER))
    try:
        before = await stream_sequences(controller_log)
        for subject in (host_subject(FLOODER, "newkind"), f"{host_subject(FLOODER, 'heartbeat')}.deeper",
                        f"grid.host.{FLOODER}", host_subject(FLOODER, "heartbeat").replace(FLOODER, FLOODER + "2")):
            await nc.publish(subject, b"{}")
            await nc.flush()
            await permission_error(nc, subject)
        await asyncio.sleep(0.3)
        assert await stream_sequences(controller_log) == before
    finally:
        await nc.close()

    # The honest path: the host's own log appends one real event of every kind it has.
    host = await _host_log(secured_server, creds, FLOODER)
    try:
        tags = {"registered": "host.registered.v1", "heartbeat": "host.heartbeat.v1",
                "protection": "host.protection.v1", "qualification": "host.qualification.v1", "ack": "host.ack.v1"}
        assert set(tags) == set(HOST_EVENT_KINDS)
        for kind, tag in tags.items():
            ev = event(tag, host_id=FLOODER, at=time.time())
            assert subject_for(ev) == host_subject(FLOODER, kind)
            res = await host.append(ev)
            assert res.stream == HOSTS_STREAM and res.seq > 0
    finally:
        await host.close()


def test_every_event_a_host_appends_is_on_one_of_its_exact_subjects() -> None:
    """A new kind of host event must be added to HOST_EVENT_KINDS, or its host could not append it."""
    golden = ROOT / "tests" / "golden" / "events"
    tags = sorted(p.name[: -len(".json")] for p in golden.glob("host.*.json"))
    assert tags
    for tag in tags:
        ev = event(tag, host_id="node.1")
        assert subject_for(ev) in host_subjects("node.1"), tag


# ---------------------------------------------------------------- message size


async def test_a_one_mib_message_from_a_host_is_refused_and_nothing_is_stored(
    controller_log: JetStreamLog, secured_server: SecuredNats, creds: CredsFactory
) -> None:
    host_creds = creds(Role.HOST, host_id=FLOODER)
    subject = host_subject(FLOODER, "heartbeat")
    before = await stream_sequences(controller_log)

    # 1 MiB: the server refuses it from this user outright (the JWT's payload limit). nats-py
    # would refuse it itself first, from the server's INFO; an attacker's client would not.
    nc = await raw_client(secured_server, host_creds)
    nc._max_payload = 8 << 20  # type: ignore[attr-defined]
    try:
        with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
            await nc.publish(subject, os.urandom(1 << 20))
            await nc.flush(timeout=3)
        # The server answers with -ERR and drops the connection. nats-py keeps that -ERR (or the
        # EOF, when the drop wins the race) as last_error and closes without calling error_cb,
        # so the client's witness is its own closed state, not its error callback.
        deadline = time.monotonic() + 3
        while not nc.is_closed and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        closed_by_server = nc.is_closed
        errors = [str(e).lower() for e in [*nc.permission_errors, nc.last_error] if e]  # type: ignore[attr-defined]
    finally:
        await nc.close()
    assert closed_by_server, errors
    # The server says why (its -ERR can race the connection's close, so its log is the witness).
    refused = f"maximum payload exceeded: {1 << 20} vs {HOST_MAX_PAYLOAD}"
    assert refused in secured_server.log_path.read_text()

    # Under the user's limit but over any host event's size (the hosts stream's max_msg_size):
    # the ingress refuses it, signed or not.
    nc = await raw_client(secured_server, host_creds)
    try:
        size = HOST_EVENT_MAX_BYTES + 4 * 1024
        assert HOST_EVENT_MAX_BYTES < size < HOST_MAX_PAYLOAD
        data = os.urandom(size)
        signer = Signer.from_creds(host_creds)
        reply = await nc.request(subject, data, timeout=5, headers=signer.sign(subject, data))
        error = json.loads(reply.data).get("error")
        assert error and "too_large" in error["description"], reply.data
    finally:
        await nc.close()
    await asyncio.sleep(0.3)
    assert await stream_sequences(controller_log) == before


def test_a_hosts_payload_limit_leaves_room_for_its_streamed_inference_answers() -> None:
    """A host's largest messages are its inference answers' chunks (with their headers)."""
    from grid.infer import wire

    assert wire.CHUNK_BYTES + 4 * 1024 <= HOST_MAX_PAYLOAD <= HOST_EVENT_MAX_BYTES + 8 * 1024


class _BigEngine:
    """A loopback engine stand-in answering with a body of several inference chunks."""

    body = os.urandom(3 * 256 * 1024 + 12_345)
    status_code = 200
    raw_headers = [(b"content-type", b"application/octet-stream"), (b"content-length", str(len(body)).encode())]

    async def post(self, url: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> "_BigEngine":
        return self

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        yield self.body

    async def aclose(self) -> None:
        pass


async def test_a_large_inference_answer_still_reaches_the_gateway_under_the_hosts_payload_limit(
    controller_log: JetStreamLog, secured_server: SecuredNats, creds: CredsFactory
) -> None:
    from grid.infer.client import InferTarget, NatsUpstream
    from grid.infer.responder import EngineRoute, InferenceResponder

    host = await _host_log(secured_server, creds, HONEST)
    gateway = await connect_log(secured_server.url, credentials=creds(Role.GATEWAY), ensure_streams=False)
    responder = InferenceResponder(host.client, HONEST, lambda model: EngineRoute("http://127.0.0.1:1", "k"),
                                   engine_client=_BigEngine(), verifier=host.authorship.verifier)  # type: ignore[union-attr]
    await responder.start()
    inference = await gateway.infer_connector()  # type: ignore[attr-defined]
    upstream = NatsUpstream(inference.client, connect_timeout=5.0, read_timeout=20.0, signer=gateway.authorship)
    try:
        response = await upstream.post(InferTarget(HONEST, "tiny", "/v1/chat/completions"), b'{"messages":[]}',
                                       [(b"content-type", b"application/json")])
        assert response.status_code == 200 and await response.aread() == _BigEngine.body
        await response.aclose()
    finally:
        await upstream.aclose()
        await responder.stop()
        await inference.close()
        await gateway.close()
        await host.close()


# ---------------------------------------------------------------- eviction


@pytest.fixture
async def small_hosts_stream(controller_log: JetStreamLog) -> AsyncIterator[int]:
    """The streams at a 1 GiB log budget (updated in place, as `gridctl up --log-budget` does):
    GRID_HOSTS (248 MiB) holds one host's whole footprint (160 MiB) and not much more."""
    controller_log.log_budget = LOG_BUDGET
    await controller_log.ensure_streams()
    info = await controller_log.client.jetstream().stream_info(HOSTS_STREAM)
    assert info.config.max_bytes == stream_byte_limits(LOG_BUDGET)[HOSTS_STREAM]
    assert info.config.max_msgs_per_subject == HOST_SUBJECT_HISTORY
    assert info.config.max_msg_size == HOST_EVENT_MAX_BYTES
    try:
        yield int(info.config.max_bytes)
    finally:
        controller_log.log_budget = None


async def _victim_and_control(controller_log: JetStreamLog, secured_server: SecuredNats,
                              creds: CredsFactory) -> tuple[list[Any], Any]:
    """An honest host's registration and ack, and a mode change: what no flood may push out."""
    victim = await _host_log(secured_server, creds, HONEST)
    try:
        registration = await victim.append(event("host.registered.v1", host_id=HONEST, at=time.time()))
        ack = await victim.append(event("host.ack.v1", host_id=HONEST, at=time.time()))
    finally:
        await victim.close()
    mode = await controller_log.append(ModeSet(event_id=new_event_id(), at=time.time(), mode="recommend"))
    return [registration, ack], mode


async def _assert_intact(controller_log: JetStreamLog, victim: list[Any], mode: Any, mode_data: bytes) -> None:
    js = controller_log.client.jetstream()
    for res in victim:  # the victim's registration and ack are still there, at their sequences
        stored = await js.get_msg(HOSTS_STREAM, res.seq)
        assert stored.subject.startswith(f"grid.host.{HONEST}.")
    assert (await controller_log.last_message(host_subject(HONEST, "registered"))).seq == victim[0].seq  # type: ignore[union-attr]
    control_after = await controller_log.last_message(MODE_SUBJECT)  # and so is the control stream
    assert control_after is not None and (control_after.seq, control_after.data) == (mode.seq, mode_data)
    info = await js.stream_info(CONTROL_STREAM)
    assert (info.state.first_seq, info.state.last_seq) == (1, mode.seq)


async def _until_still(controller_log: JetStreamLog, quiet: float = 1.0, limit: float = 60.0) -> int:
    """The hosts stream's last sequence once it stopped growing for `quiet` seconds."""
    deadline = time.monotonic() + limit
    last, since = await controller_log.last_sequence(HOSTS_STREAM), time.monotonic()
    while time.monotonic() - since < quiet:
        assert time.monotonic() < deadline, "the hosts stream never stopped growing"
        await asyncio.sleep(0.2)
        now = await controller_log.last_sequence(HOSTS_STREAM)
        if now != last:
            last, since = now, time.monotonic()
    return last


async def test_a_host_flooding_its_own_subjects_stores_no_more_than_its_ingress_budget(
    controller_log: JetStreamLog, secured_server: SecuredNats, creds: CredsFactory, small_hosts_stream: int
) -> None:
    """More bytes than the whole stream holds, signed, on every subject the flooder may publish,
    each message as large as a host event may be: the ingress stores what is within the host's
    budget per kind and refuses the rest, so not even the flooder's own history turns over."""
    max_bytes = small_hosts_stream
    victim, mode = await _victim_and_control(controller_log, secured_server, creds)
    mode_data = (await controller_log.last_message(MODE_SUBJECT)).data  # type: ignore[union-attr]
    flooder_creds = creds(Role.HOST, host_id=FLOODER)
    signer = Signer.from_creds(flooder_creds)
    body = os.urandom(HOST_EVENT_MAX_BYTES - 1024)
    per_subject = max_bytes // (len(HOST_EVENT_KINDS) * len(body)) + 16
    assert per_subject * len(HOST_EVENT_KINDS) * len(body) > max_bytes
    headers = {kind: signer.sign(host_subject(FLOODER, kind), body) for kind in HOST_EVENT_KINDS}
    started = time.monotonic()
    nc = await raw_client(secured_server, flooder_creds)
    try:
        for i in range(per_subject):
            for kind in HOST_EVENT_KINDS:
                await nc.publish(host_subject(FLOODER, kind), body, headers=headers[kind])
            if i % 16 == 15:
                await nc.flush()
        await nc.flush()
    finally:
        await nc.close()
    await _until_still(controller_log)
    elapsed = time.monotonic() - started
    for kind in HOST_EVENT_KINDS:
        policy = INGRESS_POLICIES[kind]
        allowed = (policy.burst_bytes + policy.bytes_per_second * elapsed) / len(body) + 1
        stored = await _subject_counts(controller_log, host_subject(FLOODER, kind))
        assert 0 < stored <= min(allowed, HOST_SUBJECT_HISTORY), (kind, stored, allowed)
    await _assert_intact(controller_log, victim, mode, mode_data)


async def test_a_writer_flooding_one_host_subject_evicts_only_that_subjects_history(
    controller_log: JetStreamLog, secured_server: SecuredNats, creds: CredsFactory, small_hosts_stream: int
) -> None:
    """The second line, behind the ingress: whatever lands on a host subject (a GRID client that
    may publish it, the ingress itself if its budgets were wrong) turns over only that subject's
    own history, never another host's or the control stream's."""
    max_bytes = small_hosts_stream
    assert host_footprint_bytes() < max_bytes
    # What status warns about, past this many hosts.
    assert controller_log.hosts_capacity() == protected_hosts(max_bytes) > 1
    victim, mode = await _victim_and_control(controller_log, secured_server, creds)
    mode_data = (await controller_log.last_message(MODE_SUBJECT)).data  # type: ignore[union-attr]
    body = os.urandom(HOST_EVENT_MAX_BYTES - 1024)
    per_subject = max_bytes // (len(HOST_EVENT_KINDS) * len(body)) + 16
    assert per_subject * len(HOST_EVENT_KINDS) * len(body) > max_bytes
    nc = await raw_client(secured_server, creds(Role.CONTROLLER))
    try:
        for i in range(per_subject):
            for kind in HOST_EVENT_KINDS:
                await nc.publish(host_subject(FLOODER, kind), body)
            if i % 16 == 15:
                await nc.flush()
        await nc.flush()
    finally:
        await nc.close()
    written = len(HOST_EVENT_KINDS) * per_subject
    deadline = time.monotonic() + 60
    while await controller_log.last_sequence(HOSTS_STREAM) < victim[-1].seq + written:
        assert time.monotonic() < deadline, "the flood was not stored"
        await asyncio.sleep(0.2)
    for kind in HOST_EVENT_KINDS:
        assert await _subject_counts(controller_log, host_subject(FLOODER, kind)) == HOST_SUBJECT_HISTORY
    await _assert_intact(controller_log, victim, mode, mode_data)


# ---------------------------------------------------------------- floods against a real controller


async def _flood(server: SecuredNats, creds_path: Path, subject: str, mode: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench._flooder", server.url, str(creds_path), subject, str(FLOOD_SECONDS),
        mode, FLOODER, str(FLOOD_WINDOW), cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


class FloodReport(msgspec.Struct):
    sent: int
    acked: int
    seconds: float
    stored: int
    max_age: float
    fold_seconds: float
    log_lines: int
    # Hosts-stream messages the controller's fold let past the budgets (on to signature checks).
    admitted: int


async def _honest_against_flood(controller_log: JetStreamLog, server: SecuredNats, creds: CredsFactory,
                                tmp_path: Path, mode: str) -> tuple[FloodReport, dict[str, object], bytes]:
    """A real controller, with its identity and so its own ingress (beside the fixture's: two
    controllers), folding an honest host's heartbeats (every INTERVAL) while the flooder floods
    from its own process; the honest heartbeat's age in the controller's fold sampled
    throughout. Returns the figures, the controller's status and its metrics exposition."""
    honest = await _host_log(server, creds, HONEST)
    stop = asyncio.Event()

    failed: list[str] = []
    acked: list[float] = []

    async def beat() -> None:
        t0 = time.monotonic()
        try:
            await honest.append(event("host.heartbeat.v1", host_id=HONEST, at=time.time()))
            acked.append(time.monotonic() - t0)
        except LogError as exc:  # an agent beats again at its next interval
            failed.append(str(exc))

    async def heartbeats() -> None:
        # On a fixed cadence, as an agent's heartbeat timer: a slow acknowledgement delays no beat.
        beats: set[asyncio.Task[None]] = set()
        next_at = time.monotonic()
        while not stop.is_set():
            task = asyncio.create_task(beat())
            beats.add(task)
            task.add_done_callback(beats.discard)
            next_at += INTERVAL
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, next_at - time.monotonic()))
        await asyncio.gather(*beats)

    lines: list[dict[str, object]] = []
    with structlog.testing.capture_logs() as lines:  # type: ignore[assignment]
        identity = ControllerIdentity(server.authority.directory)
        async with serving_controller(controller_log, tmp_path / "home", "ctl-footprint", identity=identity) as ctl:
            beating = asyncio.create_task(heartbeats())
            try:
                def age() -> float:
                    record = ctl.runner["fleet"].hosts.get(HONEST)
                    return float("inf") if record is None or record.heartbeat_at is None \
                        else time.time() - record.heartbeat_at

                deadline = time.monotonic() + 10
                while age() > INTERVAL:
                    assert time.monotonic() < deadline, "the honest host never showed up"
                    await asyncio.sleep(0.05)
                start_seq = await controller_log.last_sequence(HOSTS_STREAM)
                flood = await _flood(server, creds(Role.HOST, host_id=FLOODER), host_subject(FLOODER, "heartbeat"),
                                     mode)
                waiter = asyncio.create_task(flood.communicate())
                max_age = 0.0
                while not waiter.done():
                    max_age = max(max_age, age())
                    await asyncio.sleep(0.05)
                out, err = waiter.result()
                assert flood.returncode == 0, err.decode()[-2000:]
                sent = msgspec.json.decode(out.strip().splitlines()[-1], type=dict[str, Any])
                # What the server stored of the flood, and how long the fold takes to reach it.
                flood_end = time.monotonic()
                stored = 0
                previous, stored_for = -1, 0.0
                while True:
                    last = await controller_log.last_sequence(HOSTS_STREAM)
                    if last != previous:
                        previous, stored_for = last, time.monotonic() - flood_end
                    max_age = max(max_age, age())
                    if ctl.runner.positions.get(HOSTS_STREAM, 0) >= last and time.monotonic() - flood_end > 1:
                        break
                    assert time.monotonic() - flood_end < 60, "the controller's fold never caught up"
                    await asyncio.sleep(0.05)
                stored = last - start_seq
                fold_seconds = time.monotonic() - flood_end
                for _ in range(int(2 * INTERVAL / 0.05)):
                    max_age = max(max_age, age())
                    await asyncio.sleep(0.05)
                status = ctl.status()
                metrics = exposition(ctl.metrics.registry)
                budget = ctl.runner.budget
                admitted = 0 if budget is None else budget.state.admitted
            finally:
                stop.set()
                await beating
                await honest.close()
    rejection_lines = [line for line in lines if line.get("log_level") == "warning"
                       and str(line.get("event", "")).startswith(("rejected unproven", "dropped event", "skipped",
                                                                  "ingress.refused"))]
    report = FloodReport(sent=int(sent["sent"]), acked=int(sent["acked"]), seconds=float(sent["seconds"]), stored=stored, max_age=max_age,
                         fold_seconds=fold_seconds, log_lines=len(rejection_lines), admitted=admitted)
    print(f"\n{mode} flood: {report}; server still storing {stored_for:.1f}s after the flood; honest appends "
          f"failed: {len(failed)}, slowest ack {max(acked, default=0):.2f}s")
    return report, status, metrics


def _metric(metrics: bytes, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(metrics.decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


@pytest.mark.parametrize("mode", ["signed", "junk"])
async def test_a_flood_from_one_host_costs_only_that_host(
    controller_log: JetStreamLog, secured_server: SecuredNats, creds: CredsFactory, tmp_path: Path, mode: str
) -> None:
    report, status, metrics = await _honest_against_flood(controller_log, secured_server, creds, tmp_path, mode)
    assert report.sent > 5_000, report  # a real flood
    # The honest host never looked stale in the controller's fold. (How old its heartbeat gets is
    # a figure of the machine's speed, measured by bench.hostile_flood, not bounded here.)
    assert report.max_age < HEARTBEAT_TIMEOUT_SECONDS, report
    # The ingress stored what was within the flooder's heartbeat budget (signed) or nothing of
    # it (junk), beside the honest host's heartbeats: never the flood itself. Two controllers
    # relay here (the fixture's ingress and the controller's): both admit the same burst (one
    # copy each message), but past it each admits at its own rate, not always the same messages.
    policy = INGRESS_POLICIES["heartbeat"]
    span = report.seconds + report.fold_seconds + 1
    honest_beats = span / INTERVAL + 4
    flooder_bound = policy.burst_messages + 2 * policy.rate_per_second * span if mode == "signed" else 0
    assert report.stored <= flooder_bound + honest_beats, report
    # The flooder is flagged in status and metrics, by the ingress's reason.
    reason = OVER_RATE if mode == "signed" else UNSIGNED
    rows = {r["host"]: r for r in status["over_budget_hosts"]}  # type: ignore[attr-defined]
    assert set(rows) == {FLOODER}, status["over_budget_hosts"]
    assert rows[FLOODER]["dropped"].get(reason, 0) > 0 and rows[FLOODER]["over_now"]
    assert any(w.startswith(f"host {FLOODER} over its log budget") for w in status["warnings"])  # type: ignore[attr-defined]
    assert _metric(metrics, "grid_ingress_refused_total", host=FLOODER, reason=reason) > 0
    # Nothing of the flood reached the fold's second line: what it read it admitted.
    assert report.admitted <= HOST_BURST_MESSAGES + (HOST_RATE_PER_SECOND + 1) * (report.seconds + report.fold_seconds)
    assert report.log_lines <= 20, report
