"""A legitimately enrolled but hostile host replays its own signed heartbeats.

Found by an attack: the host's own older heartbeat (nothing resident), published again after
newer ones, was folded; the controller believed the replica gone and issued a real command.
Here a real controller on a secured nats-server folds the heartbeats of a host whose commands a
simulated agent carries out (SimHost, the real admission chain, no engine). Once the replica is
ready and the controller is quiet, the host publishes, through its own credential:

- its first heartbeat again, byte for byte with the signature it made (older than heartbeats the
  controller already folded), and
- a heartbeat it signs now, dated five minutes ago (older than receipt minus the allowed skew).

Both are stored by the server (the host may publish on its own subject) and rejected by the
controller's fold as `stale_replay`: counted in status and metrics by reason, no command issued,
the replica still counted. The host's honest heartbeats after them are folded as before.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import nats
from prometheus_client.parser import text_string_to_metric_families

from grid.events import codec
from grid.events.authorship import STALE_REPLAY
from grid.events.base import new_event_id
from grid.agent.credential import command_consumer
from grid.events.commands import CommandIssued
from grid.events.control import ModelProfile, ModeSet, ProfileSet
from grid.events.subjects import COMMANDS_STREAM, HOSTS_STREAM, command_subject, host_subject
from grid.identity.connect import connect_log
from grid.identity.creds import connect_options, credential_principal
from grid.identity.provision import provision_host_consumer
from grid.identity.permissions import Role
from grid.identity.signing import Identity
from grid.metrics import exposition
from grid.tasks import cancel_and_wait
from grid.transport.jetstream import JetStreamLog
from tests.heartbeats import heartbeat
from tests.integration.controller.simhost import SimHost, commands_in_log
from tests.integration.controller.statuskit import serving_controller, status_until
from tests.security.conftest import CredsFactory, SecuredNats

HOST = "replaying-host"
MODEL = "m.gguf"
# Controller ticks are 0.3 s apart (statuskit.SETTINGS): ten of them without a command is quiet.
QUIET_SECONDS = 3.0


def _ready(doc: dict, host: SimHost) -> bool:
    hosts = {h["host_id"]: h for h in doc["hosts"]}
    row = hosts.get(HOST)
    return (host.residencies.get(MODEL) == "ready" and row is not None
            and any(r["model_id"] == MODEL and r["state"] == "ready" for r in row["residencies"]))


async def _carry_out(sim: SimHost, host_log: JetStreamLog, host_creds: Path) -> None:
    """The simulated agent reads its commands as the real agent does (the durable consumer the
    controller provisioned for its credential) and answers through its own signing log."""
    sub = await host_log.subscribe(COMMANDS_STREAM, durable=command_consumer(host_creds, HOST),
                                   subject_filter=command_subject(HOST))
    try:
        while True:
            msg = await sub.next(timeout=1.0)
            if msg is None:
                continue
            ev = codec.decode(msg.data)
            if isinstance(ev, CommandIssued):
                await sim.handle(host_log, ev, time.monotonic())
            await sub.ack(msg)
    finally:
        await sub.close()


async def _quiet(log: JetStreamLog) -> int:
    """The commands stream's last sequence once nothing was appended to it for QUIET_SECONDS."""
    last = await log.last_sequence(COMMANDS_STREAM)
    while True:
        await asyncio.sleep(QUIET_SECONDS)
        now = await log.last_sequence(COMMANDS_STREAM)
        if now == last:
            return now
        last = now


async def test_a_replayed_or_back_dated_heartbeat_is_rejected_and_commands_nothing(
    secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog, tmp_path: Path,
) -> None:
    host_creds = creds(Role.HOST, host_id=HOST)
    host_log = await connect_log(secured_server.url, credentials=host_creds, name="grid-agent", ensure_streams=False)
    sim = SimHost(HOST)
    home = tmp_path / "home"
    agent: asyncio.Task[None] | None = None
    try:
        await controller_log.append(ModeSet(event_id=new_event_id(), at=time.time(), mode="automatic"))
        await controller_log.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=ModelProfile(
            model_id=MODEL, memory_mb=1000, min_replicas=1)))
        # The host's first heartbeat: nothing resident. Kept as the server stored it.
        await sim.heartbeat(host_log)
        first = await host_log.last_message(host_subject(HOST, "heartbeat"))
        assert first is not None and first.headers is not None
        assert codec.decode(first.data).residencies == ()
        principal = credential_principal(host_creds)
        assert principal is not None
        await provision_host_consumer(controller_log, principal)
        agent = asyncio.create_task(_carry_out(sim, host_log, host_creds))
        async with serving_controller(controller_log, home, "ctl-replay") as ctl:
            doc = await status_until(home, lambda: sim.heartbeat(host_log), lambda d: _ready(d, sim),
                                     "the replica ready", timeout=30)
            assert doc["rejected_events"]["total"] == 0
            commands = await _quiet(controller_log)
            folded = ctl.runner["fleet"].hosts[HOST]
            assert any(r.model_id == MODEL for r in folded.heartbeat.residencies)

            # 1. The first heartbeat again, through the host's own credential: its bytes and its
            #    signature (no message id, so the server's duplicate window does not hide it).
            nc = await nats.connect(secured_server.url, allow_reconnect=False,
                                    **connect_options(host_creds, None))
            try:
                signature = {k: v for k, v in first.headers.items() if not k.startswith("Nats-")}
                ack = await nc.jetstream().publish(first.subject, first.data, headers=signature)
                assert ack.seq > folded.heartbeat_seq
                # 2. A heartbeat the host signs now, dated five minutes ago (nothing resident).
                me = Identity.from_creds(host_creds)
                old = codec.encode(heartbeat(HOST, at=time.time() - 300.0, highest_term=sim.agent.fence.highest_term))
                subject = host_subject(HOST, "heartbeat")
                back_dated = await nc.jetstream().publish(subject, old, headers=me.sign(subject, old))
            finally:
                await nc.close()
            await ctl._await_position(HOSTS_STREAM, back_dated.seq)

            assert ctl.runner.rejected == {STALE_REPLAY: 2}
            assert [(r.seq, r.reason) for r in ctl.runner.gate.rejections] == [
                (ack.seq, STALE_REPLAY), (back_dated.seq, STALE_REPLAY)]
            assert all(r.role == Role.HOST.value for r in ctl.runner.gate.rejections)
            # Never folded: the controller still holds the heartbeat showing the replica...
            assert ctl.runner["fleet"].hosts[HOST].heartbeat_seq == folded.heartbeat_seq
            # ...and issues nothing because of them.
            await asyncio.sleep(QUIET_SECONDS)
            assert await controller_log.last_sequence(COMMANDS_STREAM) == commands
            assert [c.kind for c in await commands_in_log(controller_log)].count("warm") == 1

            # Shown by reason in `gridctl status` and on /metrics.
            doc = await status_until(home, lambda: asyncio.sleep(0), lambda d: d["rejected_events"]["total"] >= 2,
                                     "the rejections")
            assert doc["rejected_events"]["by_reason"] == {STALE_REPLAY: 2}
            assert [(r["seq"], r["reason"], r["role"]) for r in doc["rejected_events"]["latest"]] == [
                (ack.seq, STALE_REPLAY, "host"), (back_dated.seq, STALE_REPLAY, "host")]
            assert any(w.startswith("2 events rejected: stale_replay=2") for w in doc["warnings"]), doc["warnings"]
            assert _ready(doc, sim)
            samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                       for f in text_string_to_metric_families(exposition(ctl.metrics.registry).decode())
                       for s in f.samples}
            assert samples[("grid_events_rejected_total", (("reason", STALE_REPLAY),))] == 2

            # The host's honest heartbeats go on being folded as before.
            res = await host_log.append(sim.heartbeat_event())
            await ctl._await_position(HOSTS_STREAM, res.seq)
            assert ctl.runner["fleet"].hosts[HOST].heartbeat_seq == res.seq
            assert ctl.runner.rejected == {STALE_REPLAY: 2}
    finally:
        if agent is not None:
            await cancel_and_wait([agent])
        await host_log.close()
