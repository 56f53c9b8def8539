"""The grid's ingress on a real secured nats-server (grid.controller.ingress).

A host's appends cross its account's import into GRID's `grid.ingress.<id>.<kind>`, which no
stream captures; a controller stores what is signed and within the host's budget, with only the
headers the folds need, and passes the stream's PubAck back. Tried as a host would: through its
real credential, with several controllers relaying, with none, and over its budget.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import nats.js.errors
import pytest

from grid.controller.ingress import INGRESS_POLICIES, MSG_ID_HEADER, HostIngress, IngressBudget, refusal
from grid.events.authorship import SIG_HEADER, SIGNER_HEADER
from grid.events.log import LogError
from grid.events.subjects import HOSTS_STREAM, INGRESS_ROOT, host_subject
from grid.identity.connect import connect_log
from grid.identity.permissions import Role
from grid.identity.signing import Signer
from grid.projections.budget import OVER_RATE, BudgetPolicy
from grid.transport.jetstream import JetStreamLog
from tests.conftest import reset_streams
from tests.security.conftest import CredsFactory, SecuredNats, event, host_ingress, raw_client

HOST = "edge-1"


@pytest.fixture
async def bare_controller(secured_server: SecuredNats, creds: CredsFactory) -> AsyncIterator[JetStreamLog]:
    """A controller's log with fresh streams and no ingress running on it."""
    log = await connect_log(secured_server.url, name="grid-controller", credentials=creds(Role.CONTROLLER))
    await reset_streams(log)
    try:
        yield log
    finally:
        await log.close()


async def _host(server: SecuredNats, creds: CredsFactory, host_id: str = HOST) -> JetStreamLog:
    log = await connect_log(server.url, credentials=creds(Role.HOST, host_id=host_id), ensure_streams=False)
    log._timeout = 3.0  # type: ignore[attr-defined]
    return log


async def _stored(log: JetStreamLog, subject: str) -> int:
    info = await log.client.jetstream().stream_info(HOSTS_STREAM, subjects_filter=subject)
    return sum((info.state.subjects or {}).values())


async def test_with_no_controller_running_a_hosts_append_says_so_and_nothing_is_stored(
    bare_controller: JetStreamLog, secured_server: SecuredNats, creds: CredsFactory,
) -> None:
    host = await _host(secured_server, creds)
    try:
        with pytest.raises(LogError, match="no controller running"):
            await host.append(event("host.heartbeat.v1", host_id=HOST))
        # The moment one runs, the same append is stored and acknowledged.
        async with host_ingress(bare_controller):
            done = await host.append(event("host.heartbeat.v1", host_id=HOST))
    finally:
        await host.close()
    assert (done.stream, done.seq) == (HOSTS_STREAM, 1)
    assert await bare_controller.last_sequence(HOSTS_STREAM) == 1


async def test_two_controllers_relaying_store_each_append_once(
    bare_controller: JetStreamLog, secured_server: SecuredNats, creds: CredsFactory,
) -> None:
    second = await connect_log(secured_server.url, name="grid-controller-2", credentials=creds(Role.CONTROLLER))
    host = await _host(secured_server, creds)
    try:
        async with host_ingress(bare_controller), host_ingress(second):
            results = [await host.append(event("host.heartbeat.v1", host_id=HOST)) for _ in range(20)]
            await asyncio.sleep(0.3)  # the second copy of the last one has arrived too
    finally:
        await host.close()
        await second.close()
    assert [r.seq for r in results] == list(range(1, 21))
    assert await bare_controller.last_sequence(HOSTS_STREAM) == 20
    assert await _stored(bare_controller, host_subject(HOST, "heartbeat")) == 20


async def test_a_relayed_append_keeps_only_the_signature_and_its_own_message_id(
    controller_log: JetStreamLog, secured_server: SecuredNats, creds: CredsFactory,
) -> None:
    """Headers a host adds (an expected sequence, a per-message TTL, anything else) are not
    stored; its message id is kept under its host token, so no host can collide with another's."""
    host_creds = creds(Role.HOST, host_id=HOST)
    signer = Signer.from_creds(host_creds)
    subject = host_subject(HOST, "heartbeat")
    data = b'{"not": "checked here: the folds verify it"}'
    headers = {**signer.sign(subject, data), MSG_ID_HEADER: "id-1", "Nats-Expected-Last-Subject-Sequence": "999",
               "Nats-TTL": "1s", "X-Anything": "x"}
    nc = await raw_client(secured_server, host_creds)
    try:
        ack = await nc.jetstream().publish(subject, data, headers=headers)
    finally:
        await nc.close()
    stored = await controller_log.client.jetstream().get_msg(HOSTS_STREAM, ack.seq)
    assert stored.subject == subject and stored.data == data
    assert stored.headers == {SIG_HEADER: headers[SIG_HEADER], SIGNER_HEADER: headers[SIGNER_HEADER],
                              MSG_ID_HEADER: f"{HOST}:id-1"}


async def test_a_host_over_its_budget_is_refused_with_the_reason_counted_and_nothing_stored(
    bare_controller: JetStreamLog, secured_server: SecuredNats, creds: CredsFactory,
) -> None:
    tight = {**INGRESS_POLICIES, "heartbeat": BudgetPolicy(rate_per_second=0.001, burst_messages=3)}
    ingress = HostIngress(IngressBudget(tight))
    await ingress.start(bare_controller.client)
    host = await _host(secured_server, creds)
    other = await _host(secured_server, creds, "edge-2")
    try:
        outcomes = []
        for _ in range(5):
            try:
                await host.append(event("host.heartbeat.v1", host_id=HOST))
                outcomes.append("stored")
            except LogError as exc:
                outcomes.append(str(exc))
        # Its acks have a budget of their own, and another host's heartbeats are untouched.
        await host.append(event("host.ack.v1", host_id=HOST))
        for _ in range(3):
            await other.append(event("host.heartbeat.v1", host_id="edge-2"))
    finally:
        await host.close()
        await other.close()
        await ingress.stop()
    assert outcomes[:3] == ["stored"] * 3
    assert all("refused at the grid's ingress: over_rate" in o for o in outcomes[3:]), outcomes
    assert ingress.refused == {OVER_RATE: 2}
    assert ingress.budget.flagged[HOST].dropped == {OVER_RATE: 2} and set(ingress.budget.flagged) == {HOST}
    assert await _stored(bare_controller, host_subject(HOST, "heartbeat")) == 3
    assert await _stored(bare_controller, host_subject("edge-2", "heartbeat")) == 3


async def test_no_role_but_the_controller_may_publish_on_the_ingress(
    controller_log: JetStreamLog, secured_server: SecuredNats, creds: CredsFactory,
) -> None:
    """A GRID client publishing as a host at the ingress would spend that host's budget."""
    for role in (Role.GATEWAY, Role.OPERATOR, Role.READER):
        nc = await raw_client(secured_server, creds(role))
        try:
            await nc.publish(f"{INGRESS_ROOT}.{HOST}.heartbeat", b"{}")
            await nc.flush()
            await asyncio.sleep(0.2)
            errors = [str(e).lower() for e in nc.permission_errors]  # type: ignore[attr-defined]
        finally:
            await nc.close()
        assert any("permissions violation" in e for e in errors), (role, errors)
    assert await controller_log.last_sequence(HOSTS_STREAM) == 0


def test_a_refusal_reads_as_the_streams_own_error_to_a_client() -> None:
    with pytest.raises(nats.js.errors.APIError, match="refused at the grid's ingress: over_rate"):
        nats.js.errors.APIError.from_error(json.loads(refusal(OVER_RATE))["error"])
