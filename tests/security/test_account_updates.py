"""Admitting a host changes its own account and INFER's, never GRID's, and costs nobody else
anything: a new JWT for an account that exports a service drops the answers on their way back
through it (grid.identity.accounts), so these tests hold answers in flight across an admission,
against a real secured nats-server."""

from __future__ import annotations

import asyncio
import time

import nats

from grid.events.subjects import COMMANDS_STREAM, command_subject, infer_request_subject
from grid.identity.authority import Authority, sync_account_jwts
from grid.identity.connect import connect_log
from grid.identity.creds import connect_options
from grid.identity.permissions import Role
from grid.identity.provision import provision_host_consumer
from grid.transport.jetstream import JetStreamLog
from tests.security.conftest import CredsFactory, SecuredNats, infer_client, raw_client

HOST = "node-1"
PARTS = 30


async def test_a_pending_command_pull_survives_another_hosts_admission(
    secured_server: SecuredNats, authority: Authority, creds: CredsFactory, controller_log: JetStreamLog,
) -> None:
    host_creds = creds(Role.HOST, host_id=HOST)
    principal = authority.host_principal(HOST)
    assert principal.command_consumer is not None
    await provision_host_consumer(controller_log, principal)
    agent = await connect_log(secured_server.url, credentials=host_creds, ensure_streams=False)
    sub = await agent.subscribe(COMMANDS_STREAM, durable=principal.command_consumer,
                                subject_filter=command_subject(HOST))
    try:
        pending = asyncio.ensure_future(sub.next(timeout=20))
        await asyncio.sleep(0.5)  # the pull is at the server
        creds(Role.HOST, host_id="node-joining")  # admitted: its account and INFER's are pushed
        await asyncio.sleep(0.3)
        started = time.monotonic()
        await controller_log.append_raw(command_subject(HOST), b"drain")
        got = await asyncio.wait_for(pending, 10)
        # Delivered on the pull already waiting, not redelivered after the consumer's ack wait.
        assert got is not None and got.data == b"drain" and time.monotonic() - started < 3
    finally:
        await sub.close()
        await agent.close()


async def test_a_streamed_answer_survives_another_hosts_admission(
    secured_server: SecuredNats, creds: CredsFactory,
) -> None:
    host = await raw_client(secured_server, creds(Role.HOST, host_id=HOST))
    gateway = await infer_client(secured_server, creds(Role.GATEWAY))
    try:
        async def serve(msg) -> None:  # type: ignore[no-untyped-def]
            for i in range(PARTS):
                await host.publish(msg.reply, f"part {i}".encode())
                await asyncio.sleep(0.05)

        await host.subscribe(infer_request_subject(HOST), cb=serve)
        await host.flush()
        inbox = gateway.new_inbox()
        answer = await gateway.subscribe(inbox)
        await gateway.publish(infer_request_subject(HOST), b"{}", reply=inbox)
        first = [(await answer.next_msg(timeout=10)).data for _ in range(3)]
        creds(Role.HOST, host_id="node-joining-2")  # INFER's JWT changes mid-answer
        rest = [(await answer.next_msg(timeout=10)).data for _ in range(PARTS - 3)]
        assert first + rest == [f"part {i}".encode() for i in range(PARTS)]
    finally:
        await host.close()
        await gateway.close()


async def test_accounts_the_servers_already_hold_are_not_pushed_again(
    secured_server: SecuredNats, authority: Authority, creds: CredsFactory,
) -> None:
    """What a controller start hands the servers (`sync_account_jwts`): only what they hold
    otherwise; GRID, unchanged since the server started, never."""
    creds(Role.HOST, host_id=HOST)
    system = await nats.connect(secured_server.url, **connect_options(authority.system_creds(now=time.time()), None))
    try:
        assert await sync_account_jwts(system, authority.all_account_jwts(time.time())) == []
        authority.host_principal("node-invited-meanwhile")  # admitted while no server listened
        pushed = await sync_account_jwts(system, authority.all_account_jwts(time.time()))
        assert pushed == [authority.host_account_public("node-invited-meanwhile"), authority.infer_account_public]
        assert await sync_account_jwts(system, authority.all_account_jwts(time.time())) == []
    finally:
        await system.close()
