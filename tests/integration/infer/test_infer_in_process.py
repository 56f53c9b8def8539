"""The in-process path (grid.infer.local) runs the NATS path's own tests unchanged: streaming,
cancellation, slot release, refusals, a slow reader (not the snooping test: nothing of this path
crosses NATS to snoop on). Only the fixture differs: the requester finds host-a's responder in its registry, and a tap on host-a's
inference subjects and on the requester's reply inboxes proves no message of it crossed NATS.
A host whose responder is not registered (another process, another machine) is still reached
over NATS, through the same requester.

Where the paths differ on purpose: a lost NATS connection, on either side, fails or stops only
the answers that cross NATS. An in-process answer does not need the connection, so it goes on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import nats
import pytest

from grid.agent.engine_client import H1EngineClient
from grid.events.subjects import infer_wildcard
from grid.infer.client import InferTarget, NatsUpstream
from grid.infer.local import LocalResponders
from grid.infer.responder import EngineRoute, InferenceResponder
from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import JetStreamLog
from tests.integration.infer.test_infer_over_nats import (  # noqa: F401 - the engine fixture and the shared tests
    CHAT,
    JSON,
    MODEL,
    _chat,
    _long,
    engine,
    test_a_post_after_a_stream_never_lands_on_a_dead_engine_connection,
    test_a_stream_queued_behind_busy_slots_is_served_not_taken_for_an_absent_agent,
    test_an_answer_read_too_slowly_is_cut_off_as_lost_not_buffered_forever,
    test_client_disconnect_frees_the_engine_slot,
    test_non_streaming_and_streaming_answers,
    test_refusals_and_failures_map_like_http,
)

pytestmark = pytest.mark.engine


class Tap:
    """Records the messages NATS carries on some subjects (a connection of its own); with
    `inbox`, only those of requests answered under it (a request, its answer or its cancel)."""

    def __init__(self, inbox: str = "") -> None:
        self.inbox = inbox
        self.subjects: list[str] = []

    async def cb(self, msg) -> None:  # type: ignore[no-untyped-def]
        if any(s.startswith(self.inbox) for s in (msg.subject, msg.reply or "", msg.data.decode("latin-1"))):
            self.subjects.append(msg.subject)


@pytest.fixture
async def pair(nats_server: EmbeddedNats,
               engine: EngineRoute) -> AsyncIterator[tuple[NatsUpstream, InferenceResponder, JetStreamLog]]:
    agent_log = await JetStreamLog.connect(nats_server.url, name="agent-host-a")
    gateway_log = await JetStreamLog.connect(nats_server.url, name="gateway")
    responder = InferenceResponder(agent_log.client, "host-a", lambda m: engine if m == MODEL else None,
                                   engine_client=H1EngineClient())
    await responder.start()
    local = LocalResponders()
    local.add("host-a", lambda: responder)
    upstream = NatsUpstream(gateway_log.client, connect_timeout=3.0, read_timeout=120.0, local=local)
    tap_nc = await nats.connect(nats_server.url, name="tap")
    # host-a's requests and cancels from this requester (another, impatient one in the shared
    # tests still goes over NATS; requests to other hosts do too). The responder answers over
    # NATS only a request NATS delivered, so none here means no answer crossed it either.
    tap = Tap(upstream._replies.prefix)
    await tap_nc.subscribe(infer_wildcard("host-a"), cb=tap.cb)
    await tap_nc.flush()
    try:
        yield upstream, responder, gateway_log
        await gateway_log.client.flush()
        await agent_log.client.flush()
        await tap_nc.flush()
        # Everything host-a answered came in process, and nothing of it crossed the broker.
        assert upstream.sent_in_process >= 1 and responder.delivered_in_process >= 1
        assert tap.subjects == []
    finally:
        await tap_nc.close()
        await responder.stop()
        await agent_log.close()
        await gateway_log.close()


async def test_a_host_without_a_responder_here_is_reached_over_nats(pair, nats_server: EmbeddedNats,
                                                                    engine: EngineRoute) -> None:
    """host-b's agent has its own connection and is not in the registry: its request and answer
    travel over NATS while host-a's stay in process, through the one requester."""
    upstream, responder_a, _log = pair
    b_log = await JetStreamLog.connect(nats_server.url, name="agent-host-b")
    responder_b = InferenceResponder(b_log.client, "host-b", lambda m: engine if m == MODEL else None,
                                     engine_client=H1EngineClient())
    await responder_b.start()
    tap_nc = await nats.connect(nats_server.url, name="tap-b")
    tap = Tap()
    await tap_nc.subscribe(infer_wildcard("host-b"), cb=tap.cb)
    await tap_nc.flush()
    try:
        for host in ("host-a", "host-b"):
            resp = await upstream.post(InferTarget(host, MODEL, CHAT), _chat(True), JSON)
            assert resp.status_code == 200
            raw = b"".join([c async for c in resp.aiter_raw()])
            await resp.aclose()
            assert raw.rstrip().endswith(b"data: [DONE]")
        await tap_nc.flush()
        assert responder_a.delivered_in_process == 1 and responder_a.served == 1
        assert responder_b.delivered_in_process == 0 and responder_b.served == 1
        assert upstream.sent_in_process == 1
        assert tap.subjects == ["grid.infer.host-b.req"]
    finally:
        await tap_nc.close()
        await responder_b.stop()
        await b_log.close()


async def test_a_stopped_responder_answers_nothing_in_process(pair) -> None:
    """After its responder stops, a registered host gets no answer in process either (the
    registry's entry returns None once the agent drops its responder; this is the moment in
    between), so the requester reports a silent agent, never a half-served request."""
    upstream, responder, _log = pair
    resp = await upstream.post(InferTarget("host-a", MODEL, CHAT), _chat(False), JSON)
    assert resp.status_code == 200
    await resp.aread()
    await resp.aclose()
    await responder.stop()
    with pytest.raises(httpx.ConnectTimeout):
        await upstream.post(InferTarget("host-a", MODEL, CHAT), _chat(False), JSON)
    assert responder.served == 1 and responder.in_flight == 0
    assert upstream.sent_in_process == 2 and responder.delivered_in_process == 1


async def test_a_lost_connection_on_either_side_leaves_in_process_answers_whole(pair) -> None:
    """Both sides' disconnect listeners run (what nats-py's disconnected callbacks run) while a
    stream and a non-streamed answer are in flight in process: neither is failed nor stopped,
    both end complete, and each side counts the lost connection."""
    upstream, responder, _log = pair
    target = InferTarget("host-a", MODEL, CHAT)
    streamed = await upstream.post(target, _long(True, max_tokens=200), JSON)
    chunks = streamed.aiter_raw()
    first = await chunks.__anext__()
    plain = asyncio.create_task(upstream.post(target, _long(False, max_tokens=200), JSON))
    async with asyncio.timeout(10):
        while responder.in_flight < 2:
            await asyncio.sleep(0.02)
    upstream.connection_lost()
    responder.connection_lost()
    async with asyncio.timeout(60):
        raw = first + b"".join([chunk async for chunk in chunks])
        answer = await plain
        body = await answer.aread()
    await streamed.aclose()
    await answer.aclose()
    assert raw.rstrip().endswith(b"data: [DONE]")
    assert answer.status_code == 200 and json.loads(body)["usage"]["completion_tokens"] == 200
    assert responder.lost == 0 and responder.cancelled == 0 and upstream.connections_lost == 1
