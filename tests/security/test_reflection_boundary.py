"""A host's answers land in its own account: it cannot make the server write into the log.

The attack (issue 36, attack 6): an enrolled host sends JetStream API requests, or plain appends,
whose reply subject is a control subject; the server writes its answer (an API envelope, a
PubAck) there, and GRID_CTL stores it. Enough of them (more than the stream keeps per subject)
pushed the real signed `ProfileSet`, `ModeSet` and revocation out of the log. A host now lives
in an account of its own (grid.identity.accounts): every reply subject it names is one of its own
account, where no stream listens. Tried here with every subject the host can reach, at more
answers per target than GRID_CTL keeps per subject, against a real secured nats-server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import nats
import nats.js.errors
import pytest

from grid.events.subjects import (
    AUTHORITY_STREAM,
    CONTROL_STREAM,
    HOSTS_STREAM,
    MODE_SUBJECT,
    authority_record_subject,
    host_subject,
    host_subjects,
    ingress_subject,
    profile_subject,
    revocation_subject,
)
from grid.identity.connect import connect_log
from grid.identity.permissions import Role, host_imports, local_subject
from grid.identity.provision import provision_host_consumer
from grid.identity.shared_registry import ensure_stream_config
from grid.events.log import subject_for
from grid.identity.authority import Authority
from grid.transport.jetstream import STREAM_POLICIES, JetStreamLog
from tests.security.conftest import CredsFactory, SecuredNats, event, raw_client, stream_sequences

HOST = "node-1"
OTHER = "node-2"
MODEL = "smollm2-135m"
# More answers per target than GRID_CTL keeps per subject: enough to erase its history, had any landed.
ANSWERS_PER_TARGET = (STREAM_POLICIES[CONTROL_STREAM].max_msgs_per_subject or 256) + 44


def _request_body(subject: str) -> bytes:
    if ".STREAM.MSG.GET." in subject:
        return json.dumps({"last_by_subj": host_subject(HOST, "heartbeat")}).encode()
    if ".CONSUMER.MSG.NEXT." in subject:
        return json.dumps({"batch": 1, "no_wait": True}).encode()
    return b"{}"


async def test_no_answer_a_host_aims_lands_in_any_stream(
    secured_server: SecuredNats, authority: Authority, creds: CredsFactory, controller_log: JetStreamLog,
) -> None:
    host_creds = creds(Role.HOST, host_id=HOST)
    creds(Role.HOST, host_id=OTHER)
    host = authority.host_principal(HOST)
    await provision_host_consumer(controller_log, host)
    real = []
    for tag in ("control.profile_set.v1", "control.mode_set.v1", "control.credential_revoked.v1"):
        control = event(tag)
        real.append((subject_for(control), (await controller_log.append(control)).seq))
    agent = await connect_log(secured_server.url, credentials=host_creds, ensure_streams=False)
    await agent.append(event("host.heartbeat.v1", host_id=HOST))
    # The controllers' sealed authority records live in a stream of their own (made here as a
    # controller makes it): no answer may land there either.
    js = controller_log.client.jetstream()
    with contextlib.suppress(nats.js.errors.APIError):
        await js.add_stream(ensure_stream_config(1))
    authority_before = (await js.stream_info(AUTHORITY_STREAM)).state.last_seq
    before = await stream_sequences(controller_log)
    # Control subjects, another host's stream subject and its ingress subject (an answer there
    # would spend that host's budget), and an authority record's subject.
    targets = [MODE_SUBJECT, profile_subject(MODEL), revocation_subject(OTHER), host_subject(OTHER, "heartbeat"),
               ingress_subject(OTHER, "heartbeat"), authority_record_subject("host", OTHER)]
    nc = await raw_client(secured_server, host_creds)
    try:
        # Every subject the host reaches, by the name it has in the host's account (the
        # JetStream API under its prefix) and by GRID's own name (`$JS.API...`, which its
        # account answers itself: JetStream is not enabled there).
        reachable = [local_subject(s) for s in host_imports(host)]
        tried = [*reachable, *(s for s in host_imports(host) if s.startswith("$JS.API."))]
        for target in targets:
            for subject in tried:
                if subject.startswith("$JS.ACK.") or subject.endswith(".>"):
                    subject = subject.removesuffix(".>") + ".1.1.1.0.0"
                await nc.publish(subject, _request_body(subject), reply=target)
            # A plain append's PubAck, the cheapest answer of all.
            for _ in range(ANSWERS_PER_TARGET):
                await nc.publish(local_subject(f"$JS.API.STREAM.MSG.GET.{CONTROL_STREAM}"),
                                 json.dumps({"last_by_subj": MODE_SUBJECT}).encode(), reply=target)
                await nc.publish(host_subject(HOST, "protection"), b"{}", reply=target)
            await nc.flush()
        await asyncio.sleep(1.0)  # the server's answers are asynchronous
        after = await stream_sequences(controller_log)
    finally:
        await nc.close()
        await agent.close()
    assert {s: n for s, n in after.items() if s != HOSTS_STREAM} == {
        s: n for s, n in before.items() if s != HOSTS_STREAM}
    assert (await js.stream_info(AUTHORITY_STREAM)).state.last_seq == authority_before
    # In GRID_HOSTS, only what it appended itself, on its own subject (unsigned: no fold takes it).
    hosts = await js.stream_info(HOSTS_STREAM, subjects_filter=">")
    assert set(hosts.state.subjects or {}) <= set(host_subjects(HOST))
    for subject, seq in real:
        assert (await js.get_last_msg(CONTROL_STREAM, subject)).seq == seq


async def test_a_host_reaches_nothing_of_grid_but_its_imports(
    secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog,
) -> None:
    """What its account does not import gets no answer from GRID, under either name, and the
    host's reads through its imports still work (what its agent needs)."""
    host_creds = creds(Role.HOST, host_id=HOST)
    await controller_log.append(event("control.mode_set.v1"))
    nc = await raw_client(secured_server, host_creds)
    try:
        for subject in (f"$JS.API.STREAM.INFO.{CONTROL_STREAM}", local_subject(f"$JS.API.STREAM.INFO.{CONTROL_STREAM}")):
            with pytest.raises((nats.errors.NoRespondersError, nats.errors.TimeoutError)):
                await nc.request(subject, b"", timeout=1)
    finally:
        await nc.close()
    agent = await connect_log(secured_server.url, credentials=host_creds, ensure_streams=False)
    try:
        mode = await agent.last_message(MODE_SUBJECT)
        assert mode is not None and mode.subject == MODE_SUBJECT
    finally:
        await agent.close()
