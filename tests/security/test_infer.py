"""Inference over NATS under auth: a host streams many replies to the gateway's request inbox,
the gateway cancels, and a host can answer only requests the server delivered to it."""

from __future__ import annotations

import asyncio

from grid.events.subjects import infer_cancel_subject, infer_request_subject
from grid.identity.permissions import Role
from tests.security.conftest import CredsFactory, SecuredNats, infer_client, raw_client

HOST = "node-1"
PARTS = 40


async def test_a_streamed_answer_reaches_the_gateway_and_a_cancel_reaches_the_host(
    secured_server: SecuredNats, creds: CredsFactory
) -> None:
    host = await raw_client(secured_server, creds(Role.HOST, host_id=HOST))
    gateway = await infer_client(secured_server, creds(Role.GATEWAY))
    cancels: asyncio.Queue[bytes] = asyncio.Queue()
    try:
        async def serve(msg) -> None:  # type: ignore[no-untyped-def]
            # One request, many replies (the streamed answer), as grid.infer's responder sends.
            for i in range(PARTS):
                await host.publish(msg.reply, f"part {i}".encode())

        async def on_cancel(msg) -> None:  # type: ignore[no-untyped-def]
            await cancels.put(msg.data)

        await host.subscribe(infer_request_subject(HOST), cb=serve)
        await host.subscribe(infer_cancel_subject(HOST), cb=on_cancel)
        await host.flush()

        inbox = gateway.new_inbox()
        sub = await gateway.subscribe(inbox)
        await gateway.publish(infer_request_subject(HOST), b"{}", reply=inbox)
        # Generous: under a loaded CI machine one 5 s wait for a part once ran out.
        got = [(await sub.next_msg(timeout=30)).data for _ in range(PARTS)]
        assert got == [f"part {i}".encode() for i in range(PARTS)]
        await gateway.publish(infer_cancel_subject(HOST), inbox.encode())
        assert await asyncio.wait_for(cancels.get(), 5) == inbox.encode()
        assert host.permission_errors == [] and gateway.permission_errors == []  # type: ignore[attr-defined]
    finally:
        await host.close()
        await gateway.close()


async def test_a_host_cannot_write_to_an_inbox_it_was_not_asked_on(
    secured_server: SecuredNats, creds: CredsFactory
) -> None:
    host = await raw_client(secured_server, creds(Role.HOST, host_id=HOST))
    gateway = await infer_client(secured_server, creds(Role.GATEWAY))
    try:
        inbox = gateway.new_inbox()
        sub = await gateway.subscribe(inbox)
        await gateway.flush()
        await host.publish(inbox, b"forged PubAck or answer")
        await host.flush()
        wanted = f'permissions violation for publish to "{inbox}"'.lower()
        for _ in range(150):
            if any(wanted in str(e).lower() for e in host.permission_errors):  # type: ignore[attr-defined]
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError(f"no permission error; saw {host.permission_errors}")  # type: ignore[attr-defined]
        assert sub.pending_msgs == 0
    finally:
        await host.close()
        await gateway.close()
