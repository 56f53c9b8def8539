"""Gateways, operators and readers cannot make the server write into a stream either.

They are the grid's own processes, but a stolen or buggy credential of one must not write where
its role may not: a JetStream answer (an API envelope, a direct get's stored message, a PubAck)
aimed at a control, command, plan or host subject would be stored there and could push real
events out of a subject's bounded history. Each role lives in an account of its own
(GATEWAYS, OPERATORS, READERS: grid.identity.accounts) importing only its appends and reads, so
every reply subject it names is one of its own account. Tried here with every subject each role
reaches, under its local name and GRID's, against a real secured nats-server; and each role's
reads (replay, a live tail, positions) still work, by direct gets from its own account.
"""

from __future__ import annotations

import asyncio
import json

import nats
import nats.errors
import pytest

from grid.events.log import subject_for
from grid.events.subjects import (
    ALL_STREAMS,
    COMMANDS_STREAM,
    CONTROL_STREAM,
    HOSTS_STREAM,
    MODE_SUBJECT,
    PLAN_SUBJECT,
    PLANS_STREAM,
    REQUESTS_STREAM,
    host_subject,
)
from grid.identity.connect import connect_log
from grid.identity.permissions import IMPORTED_JS_PREFIX, Principal, Role, client_imports, local_subject
from grid.transport.jetstream import STREAM_POLICIES, JetStreamLog
from tests.security.conftest import CredsFactory, SecuredNats, event, raw_client, stream_sequences

HOST = "node-1"
ANSWERS_PER_TARGET = (STREAM_POLICIES[CONTROL_STREAM].max_msgs_per_subject or 256) + 44
# The stream each role may append to itself (a reflected PubAck there is a write it may make anyway).
WRITES = {Role.GATEWAY: REQUESTS_STREAM, Role.OPERATOR: CONTROL_STREAM, Role.READER: None}
TARGETS = {CONTROL_STREAM: MODE_SUBJECT, HOSTS_STREAM: host_subject(HOST, "heartbeat"), PLANS_STREAM: PLAN_SUBJECT,
           COMMANDS_STREAM: f"grid.cmd.{HOST}", REQUESTS_STREAM: "grid.req.features"}


def _body(subject: str) -> bytes:
    if ".DIRECT.GET." in subject:
        return json.dumps({"seq": 1, "batch": 50}).encode()
    if ".STREAM.MSG.GET." in subject:
        return json.dumps({"last_by_subj": MODE_SUBJECT}).encode()
    return b"{}"


def _concrete(subject: str) -> str:
    return subject.removesuffix(".>") + ".probe" if subject.endswith(".>") else subject


@pytest.mark.parametrize("role", [Role.GATEWAY, Role.OPERATOR, Role.READER])
async def test_no_answer_a_client_aims_lands_in_a_stream_it_may_not_write(
    role: Role, secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog,
) -> None:
    principal = Principal(role, streams=ALL_STREAMS if role is Role.READER else ())
    credentials = creds(role, streams=principal.streams)
    real = (await controller_log.append(event("control.mode_set.v1"))).seq
    await controller_log.append(event("control.profile_set.v1"))
    before = await stream_sequences(controller_log)
    targets = {stream: subject for stream, subject in TARGETS.items() if stream != WRITES[role]}
    reachable = client_imports(principal)
    # Every subject its account imports, by its local name and by GRID's (which its own account
    # answers itself: JetStream is not enabled there).
    tried = [*(local_subject(s) for s in reachable), *(s for s in reachable if s.startswith("$JS.API."))]
    nc = await raw_client(secured_server, credentials)
    try:
        for target in targets.values():
            for subject in tried:
                await nc.publish(_concrete(subject), _body(subject), reply=target)
            # The cheapest answers: a direct get of many stored messages, and a stream info.
            read = next(s for s in reachable if ".DIRECT.GET." in s)
            for _ in range(ANSWERS_PER_TARGET):
                await nc.publish(local_subject(read), _body(read), reply=target)
            await nc.flush()
        await asyncio.sleep(1.0)  # the server's answers are asynchronous
    finally:
        await nc.close()
    after = await stream_sequences(controller_log)
    for stream in targets:
        assert after[stream] == before[stream], f"{role} wrote into {stream} by a reflected answer"
    js = controller_log.client.jetstream()
    assert (await js.get_last_msg(CONTROL_STREAM, MODE_SUBJECT)).seq == real
    profile = subject_for(event("control.profile_set.v1"))
    assert (await js.get_last_msg(CONTROL_STREAM, profile)).seq == before[CONTROL_STREAM]


@pytest.mark.parametrize("role", [Role.GATEWAY, Role.OPERATOR, Role.READER])
async def test_a_client_reaches_no_consumer_and_nothing_it_does_not_import(
    role: Role, secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog,
) -> None:
    """No consumer create (its deliver subject would be GRID's), no management, no lease, no
    stream outside its role, under either name: refused by its permissions or answered by nobody."""
    credentials = creds(role, streams=(HOSTS_STREAM,) if role is Role.READER else ())
    nc = await raw_client(secured_server, credentials)
    refused = (f"CONSUMER.CREATE.{HOSTS_STREAM}", f"CONSUMER.CREATE.{CONTROL_STREAM}.x.grid.ctl.>",
               f"STREAM.PURGE.{CONTROL_STREAM}", f"STREAM.MSG.DELETE.{CONTROL_STREAM}", "STREAM.INFO.KV_grid_lease",
               f"DIRECT.GET.{COMMANDS_STREAM}")
    try:
        answered = [f"{prefix}.{verb}" for verb in refused for prefix in (IMPORTED_JS_PREFIX, "$JS.API")
                    if await _answered_by_grid(nc, f"{prefix}.{verb}")]
    finally:
        await nc.close()
    assert answered == []


async def _answered_by_grid(nc: nats.NATS, subject: str) -> bool:
    try:
        reply = await nc.request(subject, b"{}", timeout=1)
    except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
        return False  # refused by its permissions, or nobody answers in its account
    # "JetStream not enabled" comes from its own account, not from GRID.
    return b"not enabled" not in reply.data


@pytest.mark.parametrize("role", [Role.GATEWAY, Role.OPERATOR, Role.READER])
async def test_a_client_reads_by_direct_gets_from_its_own_account(
    role: Role, secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog,
) -> None:
    """Replay, a live tail with a subject filter, and positions, through connect_log as each role
    reads (what the gateway's routing state, `gridctl events` and the analytics sink do)."""
    credentials = creds(role, streams=(CONTROL_STREAM,) if role is Role.READER else ())
    written = [await controller_log.append(event("control.mode_set.v1")) for _ in range(3)]
    client = await connect_log(secured_server.url, credentials=credentials, ensure_streams=False)
    try:
        assert client.direct_reads and client.api_prefix == IMPORTED_JS_PREFIX
        assert await client.last_sequence(CONTROL_STREAM) == written[-1].seq
        replayed = [m async for m in client.replay(CONTROL_STREAM)]
        assert [m.seq for m in replayed] == [w.seq for w in written]
        assert all(m.subject == MODE_SUBJECT and m.headers and "Grid-Sig" in m.headers for m in replayed)
        assert all("Nats-Sequence" not in (m.headers or {}) for m in replayed)
        tail = await client.subscribe(CONTROL_STREAM, subject_filter=subject_for(event("control.profile_set.v1")))
        await controller_log.append(event("control.mode_set.v1"))
        profile = await controller_log.append(event("control.profile_set.v1"))
        got = await tail.next(timeout=5)
        assert got is not None and got.seq == profile.seq
        await tail.close()
    finally:
        await client.close()
