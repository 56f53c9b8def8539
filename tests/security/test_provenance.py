"""A host may publish only on its own subjects; what it writes inside is checked against them."""

from __future__ import annotations

from grid.events import codec
from grid.events.jetstream import JetStreamLog
from grid.events.subjects import HOSTS_STREAM, host_subject
from grid.identity.permissions import Role
from grid.identity.provenance import vouched_for
from grid.identity.connect import connect_log
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
