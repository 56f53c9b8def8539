"""A host may publish only on its own subjects; what it writes inside is checked against them."""

from __future__ import annotations

from grid.events import codec
from grid.events.subjects import HOSTS_STREAM, host_subject
from grid.identity.connect import connect_log
from grid.identity.permissions import Role
from grid.identity.provenance import SUBJECT_MISMATCH, vouched_for
from grid.projections.runner import CORE_PROJECTIONS, ProjectionRunner
from grid.transport.jetstream import JetStreamLog
from tests.security.conftest import CredsFactory, SecuredNats, event


async def test_a_heartbeat_naming_another_host_on_its_own_subject_is_not_vouched_for(
    secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog
) -> None:
    host = await connect_log(secured_server.url, credentials=creds(Role.HOST, host_id="node-1"),
                                      ensure_streams=False)
    try:
        honest = event("host.heartbeat.v1", host_id="node-1")
        forged = event("host.heartbeat.v1", host_id="node-2")
        await host.append(honest)
        # The server cannot read payloads: on its own subject the host's bytes are stored...
        await host.append_raw(host_subject("node-1", "heartbeat"), codec.encode(forged), msg_id=forged.event_id)
    finally:
        await host.close()
    stored = [m async for m in controller_log.replay(HOSTS_STREAM)]
    assert [m.subject for m in stored] == [host_subject("node-1", "heartbeat")] * 2
    # ...and only the honest one is vouched for by the subject the server authenticated.
    assert [vouched_for(m, codec.decode(m.data)) for m in stored] == [True, False]


async def test_projections_skip_what_the_subject_does_not_vouch_for(
    secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog
) -> None:
    """The controller's folds reject the forged heartbeat as unvouched (its signature holds: the
    host did write it, on its own subject) and never list node-2."""
    host = await connect_log(secured_server.url, credentials=creds(Role.HOST, host_id="node-1"),
                             ensure_streams=False)
    try:
        await host.append(event("host.heartbeat.v1", host_id="node-1"))
        forged = event("host.heartbeat.v1", host_id="node-2")
        await host.append_raw(host_subject("node-1", "heartbeat"), codec.encode(forged), msg_id=forged.event_id)
    finally:
        await host.close()
    runner = ProjectionRunner(CORE_PROJECTIONS)
    await runner.catch_up(controller_log)
    assert sorted(runner["fleet"].hosts) == ["node-1"]
    assert runner.unvouched == 1 and runner.malformed == 0
    assert runner.rejected == {SUBJECT_MISMATCH: 1}
    assert runner.gate.rejections[0].role == Role.HOST.value
