"""The positive side: every identity can do what its job needs, through JetStreamLog, with auth on."""

from __future__ import annotations

import asyncio

from grid.events.subjects import (
    ALL_STREAMS,
    COMMANDS_STREAM,
    CONTROL_STREAM,
    HOSTS_STREAM,
    LEASE_BUCKET,
    PLANS_STREAM,
    REQUESTS_STREAM,
    command_subject,
    host_subject,
)
from grid.identity.connect import connect_log
from grid.identity.creds import credential_principal
from grid.identity.permissions import Role
from grid.identity.provision import provision_host_consumer
from grid.transport.jetstream import JetStreamLog
from tests.security.conftest import CredsFactory, SecuredNats, event

HOST = "node-1.example"


async def test_controller_appends_everywhere_and_holds_the_lease(controller_log: JetStreamLog) -> None:
    for tag in ("host.heartbeat.v1", "request.batch.v1", "control.mode_set.v1", "plan.created.v1",
                "command.issued.v1"):
        result = await controller_log.append(event(tag))
        assert result.seq == 1
    assert await controller_log.kv_put(LEASE_BUCKET, "controller", b"term-1", expected_revision=0) == 1
    entry = await controller_log.kv_get(LEASE_BUCKET, "controller")
    assert entry is not None and entry.value == b"term-1"
    assert await controller_log.last_subject_sequence("grid.plan") == 1


async def test_host_speaks_for_itself_and_consumes_its_own_commands(
    secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog
) -> None:
    host_creds = creds(Role.HOST, host_id=HOST)
    principal = credential_principal(host_creds)
    assert principal is not None and principal.command_consumer is not None
    await provision_host_consumer(controller_log, principal)
    host = await connect_log(secured_server.url, name="grid-agent",
                                      credentials=host_creds, ensure_streams=False)
    try:
        for tag in ("host.registered.v1", "host.heartbeat.v1", "host.protection.v1", "host.ack.v1"):
            result = await host.append(event(tag, host_id=HOST))
            assert result.stream == HOSTS_STREAM
        command = event("command.issued.v1", host_id=HOST)
        await controller_log.append(command)
        sub = await host.subscribe(COMMANDS_STREAM, durable=principal.command_consumer,
                                   subject_filter=command_subject(HOST))
        got = await sub.next(timeout=5)
        assert got is not None and got.subject == command_subject(HOST) and got.msg_id == command.event_id
        await sub.ack(got)
        await sub.close()
        # Acked for good: a second subscription sees nothing more.
        again = await host.subscribe(COMMANDS_STREAM, durable=principal.command_consumer,
                                     subject_filter=command_subject(HOST))
        assert await again.next(timeout=1) is None
        await again.close()
    finally:
        await host.close()
    assert await controller_log.last_sequence(HOSTS_STREAM) == 4


async def test_host_reads_back_its_own_last_events_and_the_lease(
    secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog
) -> None:
    """Clock sync and fence restore read the host's own subjects; the lease check reads the key."""
    await controller_log.kv_put(LEASE_BUCKET, "controller", b"term-7")
    host = await connect_log(secured_server.url, credentials=creds(Role.HOST, host_id=HOST), ensure_streams=False)
    try:
        appended = await host.append(event("host.heartbeat.v1", host_id=HOST))
        mine = await host.last_message(host_subject(HOST, "heartbeat"))
        assert mine is not None and mine.seq == appended.seq and mine.time > 0
        assert await host.last_message(host_subject(HOST, "protection")) is None
        lease = await host.kv_get(LEASE_BUCKET, "controller")
        assert lease is not None and lease.value == b"term-7"
    finally:
        await host.close()


async def test_gateway_appends_requests_and_reads_hosts_control_and_plans(
    secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog
) -> None:
    await controller_log.append(event("host.heartbeat.v1"))
    await controller_log.append(event("control.profile_set.v1"))
    await controller_log.append(event("plan.created.v1"))
    gateway = await connect_log(secured_server.url, name="grid-gateway",
                                         credentials=creds(Role.GATEWAY), ensure_streams=False)
    try:
        assert (await gateway.append(event("request.batch.v1"))).stream == REQUESTS_STREAM
        for stream in (HOSTS_STREAM, CONTROL_STREAM, PLANS_STREAM):
            assert await gateway.last_sequence(stream) == 1
            assert [m.seq async for m in gateway.replay(stream)] == [1]
        live = await gateway.subscribe(HOSTS_STREAM, start_seq=1)
        assert (await live.next(timeout=5)) is not None
        await live.close()
    finally:
        await gateway.close()


async def test_operator_reads_every_stream_and_publishes_control(
    secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog
) -> None:
    for tag in ("host.heartbeat.v1", "request.batch.v1", "plan.created.v1", "command.issued.v1"):
        await controller_log.append(event(tag))
    operator = await connect_log(secured_server.url, name="gridctl",
                                          credentials=creds(Role.OPERATOR), ensure_streams=False)
    try:
        for tag in ("control.profile_set.v1", "control.mode_set.v1", "control.host_override.v1",
                    "control.tick_requested.v1", "control.profile_removed.v1"):
            assert (await operator.append(event(tag))).stream == CONTROL_STREAM
        counts = {s: len([m async for m in operator.replay(s)]) for s in ALL_STREAMS}
        assert counts == {HOSTS_STREAM: 1, REQUESTS_STREAM: 1, CONTROL_STREAM: 5, PLANS_STREAM: 1,
                          COMMANDS_STREAM: 1}
    finally:
        await operator.close()


async def test_reader_reads_the_streams_it_was_given(
    secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog
) -> None:
    await controller_log.append(event("host.heartbeat.v1"))
    await controller_log.append(event("request.batch.v1"))
    reader = await connect_log(secured_server.url, name="dashboard", ensure_streams=False,
                                        credentials=creds(Role.READER, streams=(HOSTS_STREAM, REQUESTS_STREAM)))
    try:
        for stream in (HOSTS_STREAM, REQUESTS_STREAM):
            assert [m.seq async for m in reader.replay(stream)] == [1]
        sub = await reader.subscribe(REQUESTS_STREAM, start_seq=1)
        assert (await sub.next(timeout=5)) is not None
        await sub.close()
        await asyncio.sleep(0)
    finally:
        await reader.close()
