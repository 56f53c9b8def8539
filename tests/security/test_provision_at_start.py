"""The controller's identity start: a command consumer for every admitted, unrevoked host, made
concurrently against a real secured nats-server, and a host reads its commands through it."""

from __future__ import annotations

import time
from pathlib import Path

from grid.events.subjects import COMMANDS_STREAM, command_subject
from grid.identity.authority import Authority
from grid.identity.connect import connect_log
from grid.identity.creds import write_creds
from grid.identity.service import PROVISION_CONCURRENCY, ControllerIdentity
from grid.transport.jetstream import JetStreamLog
from tests.security.conftest import SecuredNats, event


async def test_every_admitted_host_gets_its_consumer_and_a_revoked_one_none(
        secured_server: SecuredNats, authority: Authority, controller_log: JetStreamLog, tmp_path: Path) -> None:
    hosts = [f"fleet-{i:03d}" for i in range(2 * PROVISION_CONCURRENCY + 3)]
    issued = authority.issue_host_creds([*hosts, "fleet-revoked"], now=time.time(), ttl_seconds=3600.0)
    revoked_consumer = authority.host_principal("fleet-revoked").command_consumer
    authority.revoke_host("fleet-revoked", now=time.time())
    identity = ControllerIdentity(authority.directory)
    await identity.start(controller_log, controller_log.client)
    try:
        js = controller_log.client.jetstream()
        names = {c.name for c in await js.consumers_info(COMMANDS_STREAM)}
        wanted = {p.command_consumer for p in authority.admitted_hosts() if p.host_id in hosts}
        assert len(wanted) == len(hosts) and wanted <= names
        assert revoked_consumer not in names
        # The last host reads a command through the consumer made for it.
        last = hosts[-1]
        await controller_log.append(event("command.issued.v1", host_id=last))
        token, seed = issued[last]
        agent = await connect_log(secured_server.url, credentials=write_creds(tmp_path / "h.creds", token, seed),
                                  ensure_streams=False)
        try:
            principal = authority.host_principal(last)
            sub = await agent.subscribe(COMMANDS_STREAM, durable=principal.command_consumer,
                                        subject_filter=command_subject(last))
            got = await sub.next(timeout=5)
            assert got is not None and got.subject == command_subject(last)
            await sub.ack(got)
            await sub.close()
        finally:
            await agent.close()
    finally:
        await identity.stop()
