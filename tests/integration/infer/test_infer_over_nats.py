"""Inference over NATS against a real nats-server and a real llama-server with the real GGUF.

The gateway side (`NatsUpstream`) and the agent side (`InferenceResponder`) hold separate NATS
connections, as they do on two machines; the engine listens on loopback with its own key.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import nats
import pytest

from grid.agent.engine_client import H1EngineClient
from grid.agent.engines.llama_cpp import EngineSpec, probe_active, spawn
from grid.agent.engines.runtime import Runtime
from grid.events.subjects import ALL_STREAMS, infer_request_subject, infer_wildcard
from grid.gateway.breaker import CLOSED
from grid.gateway.responses import STREAM_OK, ProxyStream, completes_event_stream
from grid.gateway.routes import build_routes, exception_handlers
from grid.gateway.upstream import Upstream
from grid.infer.client import InferTarget, NatsUpstream, NotServedThere, UpstreamConnectionLost
from grid.infer.responder import EngineRoute, InferenceResponder
from grid.transport.embedded import EmbeddedNats, free_port
from grid.transport.jetstream import JetStreamLog
from starlette.applications import Starlette

from tests.unit.gateway.test_placed_routing import Fleet, fleet, ready  # noqa: F401 - the fixture

pytestmark = pytest.mark.engine

MODEL = "smol"
CHAT = "/v1/chat/completions"
JSON = [(b"content-type", b"application/json")]


@pytest.fixture(scope="module")
def engine(engine_runtime: Runtime, bundled_gguf: Path, tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("infer-engine")
    key = secrets.token_urlsafe(24)
    key_file = home / "engine.key"
    key_file.write_text(key)
    key_file.chmod(0o600)
    spec = EngineSpec(model_id=MODEL, model_path=bundled_gguf, port=free_port(), key_file=key_file, slots=2,
                      context_size=1024, threads=1)
    proc = spawn(engine_runtime.command, spec, home / "engine.log")
    try:
        # Synchronous polling: a module fixture must not run an event loop of its own.
        deadline = time.monotonic() + 120
        while not _healthy(spec.endpoint, key):
            assert proc.poll() is None and time.monotonic() < deadline, (home / "engine.log").read_text()[-2000:]
            time.sleep(0.1)
        yield EngineRoute(spec.endpoint, key)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(params=["httpx", "h1"])
async def pair(request: pytest.FixtureRequest, nats_server: EmbeddedNats,
               engine: EngineRoute) -> AsyncIterator[tuple[NatsUpstream, InferenceResponder, JetStreamLog]]:
    """The agent side runs with the default engine client and with the agent's own (h1)."""
    agent_log = await JetStreamLog.connect(nats_server.url, name="agent-host-a")
    gateway_log = await JetStreamLog.connect(nats_server.url, name="gateway")
    client = H1EngineClient() if request.param == "h1" else None
    responder = InferenceResponder(agent_log.client, "host-a", lambda m: engine if m == MODEL else None,
                                   engine_client=client)
    await responder.start()
    try:
        yield NatsUpstream(gateway_log.client, connect_timeout=3.0, read_timeout=120.0), responder, gateway_log
    finally:
        await responder.stop()
        await agent_log.close()
        await gateway_log.close()


def _healthy(endpoint: str, key: str) -> bool:
    try:
        return httpx.get(endpoint + "/health", headers={"Authorization": f"Bearer {key}"}, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def _chat(stream: bool, max_tokens: int = 8) -> bytes:
    return json.dumps({"model": MODEL, "stream": stream, "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": "Say hello"}]}).encode()


async def test_non_streaming_and_streaming_answers(pair) -> None:
    upstream, responder, _log = pair
    resp = await upstream.post(InferTarget("host-a", MODEL, CHAT), _chat(False), JSON)
    assert resp.status_code == 200
    assert (b"content-type", b"application/json; charset=utf-8") in [(k.lower(), v) for k, v in resp.raw_headers]
    body = json.loads(await resp.aread())
    await resp.aclose()
    assert body["choices"][0]["message"]["content"] and body["usage"]["completion_tokens"] >= 1

    resp = await upstream.post(InferTarget("host-a", MODEL, CHAT), _chat(True), JSON)
    assert resp.status_code == 200
    raw = b"".join([c async for c in resp.aiter_raw()])
    await resp.aclose()
    events = [line for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert len(events) >= 3 and events[-1] == "data: [DONE]"
    assert responder.served == 2 and responder.in_flight == 0


async def test_client_disconnect_frees_the_engine_slot(pair, engine: EngineRoute) -> None:
    upstream, responder, _log = pair
    # A short answer could end before the slot is read: this one runs until it is closed.
    resp = await upstream.post(InferTarget("host-a", MODEL, CHAT), _long(True), JSON)
    it = resp.aiter_raw()
    first = await it.__anext__()
    assert first
    async with httpx.AsyncClient() as c:
        assert await probe_active(c, engine.endpoint, engine.key) == 1
        await resp.aclose()  # the gateway's client went away
        for _ in range(100):
            if responder.in_flight == 0 and await probe_active(c, engine.endpoint, engine.key) == 0:
                break
            await asyncio.sleep(0.05)
        assert responder.cancelled == 1 and responder.in_flight == 0
        assert await probe_active(c, engine.endpoint, engine.key) == 0


async def test_refusals_and_failures_map_like_http(pair, nats_server: EmbeddedNats) -> None:
    upstream, _responder, _log = pair
    # No agent for the host: a connect error (the breaker counts it), fast, nothing replayed.
    with pytest.raises(httpx.ConnectError, match="no agent"):
        await upstream.post(InferTarget("host-absent", MODEL, CHAT), _chat(False), JSON)
    # A model this host has no ready engine for: refused before any engine saw it (the gateway
    # may ask another replica); a path Grid does not forward: an OpenAI-shaped answer.
    with pytest.raises(NotServedThere, match="no ready engine for 'other-model'") as refused:
        await upstream.post(InferTarget("host-a", "other-model", CHAT), _chat(False), JSON)
    assert (refused.value.host_id, refused.value.model_id) == ("host-a", "other-model")
    resp = await upstream.post(InferTarget("host-a", MODEL, "/slots"), b"", JSON)
    assert resp.status_code == 404 and json.loads(await resp.aread())["error"]["code"] == "path_not_allowed"
    await resp.aclose()

    # An engine that is down: the agent reports a transport failure, not an answer.
    down = await JetStreamLog.connect(nats_server.url, name="agent-host-down")
    dead = InferenceResponder(down.client, "host-down", lambda m: EngineRoute(f"http://127.0.0.1:{free_port()}", "k"))
    await dead.start()
    try:
        with pytest.raises(httpx.ConnectError, match="engine unreachable"):
            await upstream.post(InferTarget("host-down", MODEL, CHAT), _chat(False), JSON)
    finally:
        await dead.stop()
        await down.close()


async def test_prompts_are_never_persisted_and_keys_never_travel(pair, nats_server: EmbeddedNats, engine: EngineRoute) -> None:
    upstream, _responder, log = pair
    js = log.client.jetstream()
    for stream in ALL_STREAMS:
        info = await js.stream_info(stream)
        for pattern in info.config.subjects or ():
            assert not _matches(pattern, infer_request_subject("host-a")), (stream, pattern)
    before = {s: (await js.stream_info(s)).state.messages for s in ALL_STREAMS}

    snoop = await nats.connect(nats_server.url)
    seen: list[tuple[str, dict[str, str], bytes]] = []

    async def record(m) -> None:
        seen.append((m.subject, dict(m.headers or {}), m.data))

    await snoop.subscribe(infer_wildcard(), cb=record)
    await snoop.subscribe("_INBOX.>", cb=record)
    await snoop.flush()
    try:
        resp = await upstream.post(InferTarget("host-a", MODEL, CHAT), _chat(False),
                                   JSON + [(b"authorization", b"Bearer client-secret")])
        await resp.aread()
        await resp.aclose()
        await snoop.flush()
        await asyncio.sleep(0.2)
    finally:
        await snoop.close()
    assert seen, "the exchange crossed NATS"
    for _subject, headers, data in seen:
        assert "Authorization" not in headers and "authorization" not in headers
        assert engine.key.encode() not in data and b"client-secret" not in data
    assert {s: (await js.stream_info(s)).state.messages for s in ALL_STREAMS} == before


def _matches(pattern: str, subject: str) -> bool:
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(p) == len(s)


async def test_a_small_answer_is_one_message_and_a_stream_head_goes_before_its_first_bytes(pair) -> None:
    """A small answer is one message (status, headers and bytes: no extra hop before it). A
    stream's message 0 is the engine's head alone, sent before the engine has a token, so the
    first token crosses as one body message (the gateway answers its client's head meanwhile)."""
    upstream, _responder, gateway_log = pair
    seen: list[tuple[dict[str, str], bytes]] = []

    async def tap(msg) -> None:  # type: ignore[no-untyped-def]
        seen.append((dict(msg.headers or {}), msg.data))

    sub = await gateway_log.client.subscribe("_INBOX.>", cb=tap)
    await gateway_log.client.flush()
    resp = await upstream.post(InferTarget("host-a", MODEL, CHAT), _chat(False), JSON)
    body = await resp.aread()
    await resp.aclose()
    await gateway_log.client.flush()
    assert len(seen) == 1 and seen[0][0]["Grid-Seq"] == "0" and "Grid-End" in seen[0][0] and seen[0][1] == body

    seen.clear()
    resp = await upstream.post(InferTarget("host-a", MODEL, CHAT), _chat(True), JSON)
    raw = b"".join([c async for c in resp.aiter_raw()])
    await resp.aclose()
    await sub.unsubscribe()
    head, first = seen[0], seen[1]
    assert head[0]["Grid-Seq"] == "0" and head[0]["Grid-Status"] == "200" and head[1] == b""
    assert "text/event-stream" in head[0]["Grid-Headers"] and "Grid-End" not in head[0]
    assert resp.head_only  # what tells the gateway to send its client the head at once
    assert first[0]["Grid-Seq"] == "1" and first[1].startswith(b"data: ") and raw.startswith(first[1])


async def test_a_post_after_a_stream_never_lands_on_a_dead_engine_connection(pair) -> None:
    """llama-server drops the connection after a stream; the gateway's "Connection: close" for
    streams reaches the engine, so the next POST gets a fresh connection instead of failing
    (a failed POST could not be replayed)."""
    upstream, responder, _log = pair
    failures = []
    for _ in range(40):
        for stream in (True, False):
            headers = JSON + ([(b"connection", b"close")] if stream else [(b"connection", b"keep-alive")])
            try:
                resp = await upstream.post(InferTarget("host-a", MODEL, CHAT), _chat(stream, max_tokens=2), headers)
                await resp.aread()
                await resp.aclose()
            except httpx.HTTPError as exc:
                failures.append(repr(exc))
    assert failures == []


async def test_an_answer_read_too_slowly_is_cut_off_as_lost_not_buffered_forever(pair, monkeypatch) -> None:
    from grid.infer import client

    monkeypatch.setattr(client, "MAX_PENDING_MESSAGES", 3)
    upstream, _responder, _log = pair
    resp = await upstream.post(InferTarget("host-a", MODEL, CHAT), _chat(True, max_tokens=40), JSON)
    await asyncio.sleep(3.0)  # the whole answer arrives while nobody reads
    with pytest.raises(httpx.ReadError, match="lost part of the answer"):
        async for _chunk in resp.aiter_raw():
            pass
    await resp.aclose()


async def test_a_stream_queued_behind_busy_slots_is_served_not_taken_for_an_absent_agent(pair) -> None:
    """Both engine slots busy: a third stream gets the engine's headers at once (passed on at
    once) but its first chunk only when a slot frees. The agent says it is working on it
    meanwhile, so a wait longer than the connect timeout is not taken for an absent agent (it used
    to fail with a connect timeout while the engine had it queued)."""
    upstream, responder, gateway_log = pair
    connect_timeout = 1.5
    impatient = NatsUpstream(gateway_log.client, connect_timeout=connect_timeout, read_timeout=120.0)

    def body(tokens: int) -> bytes:
        return json.dumps({"model": MODEL, "max_tokens": tokens, "stream": True, "ignore_eos": True,
                           "messages": [{"role": "user", "content": "Count"}]}).encode()

    async def stream(up: NatsUpstream, tokens: int) -> tuple[float, bytes]:
        t0 = time.monotonic()
        r = await up.post(InferTarget("host-a", MODEL, CHAT), body(tokens), JSON + [(b"connection", b"close")])
        assert r.status_code == 200
        waits: list[float] = []
        out = b"".join([c async for c in _timed_first(r.aiter_raw(), t0, waits)])
        await r.aclose()
        return waits[0], out

    busy = [asyncio.create_task(stream(upstream, 400)) for _ in range(2)]
    deadline = time.monotonic() + 30
    while responder.in_flight < 2:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    waited, out = await stream(impatient, 4)
    assert out.rstrip().endswith(b"data: [DONE]")
    for _, long in await asyncio.gather(*busy):
        assert long.rstrip().endswith(b"data: [DONE]")
    # The claim needs a queue longer than the connect timeout, or it proves nothing.
    assert waited > connect_timeout, waited


async def _timed_first(chunks: AsyncIterator[bytes], t0: float, waits: list[float]) -> AsyncIterator[bytes]:
    """`chunks`, noting in `waits` how long after `t0` the first one came."""
    async for chunk in chunks:
        if not waits:
            waits.append(time.monotonic() - t0)
        yield chunk


def _long(stream: bool, max_tokens: int = 4000) -> bytes:
    return json.dumps({"model": MODEL, "max_tokens": max_tokens, "stream": stream, "ignore_eos": True,
                       "messages": [{"role": "user", "content": "Count"}]}).encode()


async def _engine_idle(responder: InferenceResponder, engine: EngineRoute) -> bool:
    async with httpx.AsyncClient() as c:
        for _ in range(100):
            if responder.in_flight == 0 and await probe_active(c, engine.endpoint, engine.key) == 0:
                return True
            await asyncio.sleep(0.05)
    return False


async def _two_in_flight(upstream: NatsUpstream, responder: InferenceResponder,
                         target: InferTarget) -> tuple[object, AsyncIterator[bytes], asyncio.Task[object]]:
    """A started stream and a non-streamed answer being generated, both in the agent's hands.
    The non-streamed one is short enough that the engine, which finishes such an answer after
    its client left, frees the slot within seconds afterwards even on a loaded machine."""
    streamed = await upstream.post(target, _long(True), JSON + [(b"connection", b"close")])
    chunks = streamed.aiter_raw()
    assert await chunks.__anext__()
    plain = asyncio.create_task(upstream.post(target, _long(False, max_tokens=300), JSON))
    deadline = time.monotonic() + 10
    while responder.in_flight < 2:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    return streamed, chunks, plain


async def _both_lost(streamed: object, chunks: AsyncIterator[bytes], plain: asyncio.Task[object],
                     responder: InferenceResponder, bound: float) -> None:
    """Both answers fail as a lost connection within `bound` seconds, and the agent stops both."""
    t0 = time.monotonic()
    with pytest.raises(UpstreamConnectionLost):
        async with asyncio.timeout(bound):
            async for _chunk in chunks:
                pass
    with pytest.raises(UpstreamConnectionLost):
        async with asyncio.timeout(bound):
            await plain
    assert time.monotonic() - t0 < bound
    await streamed.aclose()  # type: ignore[attr-defined]
    deadline = time.monotonic() + 5
    while responder.in_flight:
        assert time.monotonic() < deadline, "the agent kept answering for nobody"
        await asyncio.sleep(0.05)


async def _engine_slots_free(engine: EngineRoute) -> None:
    """llama-server finishes a non-streamed answer whose connection closed (only a stream stops at
    once): wait for it so the next test finds both slots free."""
    async with httpx.AsyncClient() as c:
        deadline = time.monotonic() + 60
        while await probe_active(c, engine.endpoint, engine.key):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)


async def test_a_lost_gateway_connection_fails_the_requests_in_flight_at_once(pair, engine: EngineRoute) -> None:
    """The gateway's log reports its connection lost: a started stream and a non-streamed request
    still being generated both fail at once (no reply can arrive on a restarted server), and the
    agent is asked to cancel both."""
    upstream, responder, gateway_log = pair
    gateway_log.add_disconnect_listener(upstream.connection_lost)
    try:
        streamed, chunks, plain = await _two_in_flight(upstream, responder, InferTarget("host-a", MODEL, CHAT))
        gateway_log._disconnected()  # what nats-py's disconnected callback runs
        await _both_lost(streamed, chunks, plain, responder, 2)
        assert responder.cancelled == 2 and upstream.connections_lost == 1
        await _engine_slots_free(engine)
    finally:
        gateway_log.remove_disconnect_listener(upstream.connection_lost)


async def test_a_killed_nats_server_fails_requests_in_flight_over_nats_at_once_and_serving_resumes(
        engine: EngineRoute, tmp_path: Path) -> None:
    """kill -9 of the nats-server itself (its own here, so the session's stays up), with the
    gateway and the agent wired as the gateway state and the agent service wire them: a started
    stream and a non-streamed answer being generated both fail with `upstream_connection_lost`
    within seconds (never the read timeout), the agent stops both, and once the server is back
    on the same port a new request is answered."""
    server = EmbeddedNats(tmp_path / "nats").start()
    agent_log = gateway_log = None
    responder = None
    try:
        agent_log = await JetStreamLog.connect(server.url, name="agent-host-a")
        gateway_log = await JetStreamLog.connect(server.url, name="gateway", ensure_streams=False)
        responder = InferenceResponder(agent_log.client, "host-a", lambda m: engine if m == MODEL else None)
        await responder.start()
        upstream = NatsUpstream(gateway_log.client, connect_timeout=3.0, read_timeout=120.0)
        gateway_log.add_disconnect_listener(upstream.connection_lost)
        agent_log.add_disconnect_listener(responder.connection_lost)
        target = InferTarget("host-a", MODEL, CHAT)
        streamed, chunks, plain = await _two_in_flight(upstream, responder, target)
        assert server.process is not None
        server.process.kill()
        await _both_lost(streamed, chunks, plain, responder, 5)
        assert responder.lost == 2 and upstream.connections_lost == 1
        server.process.wait()
        server.respawn()
        await asyncio.to_thread(server.wait_ready)
        deadline = time.monotonic() + 20
        while True:  # both clients reconnect on their own
            try:
                response = await upstream.post(target, _chat(False), JSON)
                body = await response.aread()
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "no answer after the server came back"
                await asyncio.sleep(0.2)
        assert response.status_code == 200 and json.loads(body)["choices"]
        await _engine_slots_free(engine)
    finally:
        if responder is not None:
            await responder.stop()
        for event_log in (agent_log, gateway_log):
            if event_log is not None:
                await event_log.close()
        server.stop()


async def test_a_lost_agent_connection_stops_the_engine_and_ends_the_answer(pair, engine: EngineRoute) -> None:
    """The agent's connection is lost: it stops generating for nobody (the engine slot frees) and,
    should the requester still be listening, ends the answer with the error the gateway gives
    when its own connection is lost (which of the two notices first is a race)."""
    upstream, responder, _log = pair
    streamed = await upstream.post(InferTarget("host-a", MODEL, CHAT), _long(True), JSON + [(b"connection", b"close")])
    chunks = streamed.aiter_raw()
    assert await chunks.__anext__()
    responder.connection_lost()
    with pytest.raises(UpstreamConnectionLost, match="agent lost its NATS connection"):
        async with asyncio.timeout(5):
            async for _chunk in chunks:
                pass
    await streamed.aclose()
    assert await _engine_idle(responder, engine)
    assert responder.lost == 1


async def test_a_host_with_no_ready_engine_refuses_and_the_gateway_asks_another_replica(
    fleet: Fleet, nats_server: EmbeddedNats, engine: EngineRoute,  # noqa: F811
) -> None:
    """A copy that is draining, or a gateway a heartbeat behind its host: the agent answers "no
    ready engine for this model here" before any engine saw the request. That is proof, like NATS's
    "no responders", that sending it elsewhere replays nothing: the gateway asks another replica
    instead of passing the refusal on, and neither marks the host unroutable nor counts a failure
    against it (its other models and its next heartbeat decide)."""
    agents = [await JetStreamLog.connect(nats_server.url, name=f"agent-{h}") for h in ("h1", "h2")]
    gateway_log = await JetStreamLog.connect(nats_server.url, name="gateway")
    serving = InferenceResponder(agents[0].client, "h1", lambda m: engine if m == "m" else None)
    draining = InferenceResponder(agents[1].client, "h2", lambda m: None)
    await serving.start()
    await draining.start()
    app = Starlette(routes=build_routes(), exception_handlers=exception_handlers())
    app.state.gateway = fleet.gw
    try:
        for host, port in (("h1", 1), ("h2", 2)):
            claim = ready(managed=False, sha=None, port=port)
            await fleet.placements.admit(host, [claim])  # the operator admitted both external engines
            await fleet.heartbeat(host, claim)
        fleet.gw.upstream = Upstream(backend="nats", nc=gateway_log.client, read_timeout=120.0)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw",
                                     timeout=120) as http:
            for i in range(8):  # affinity spreads these over both replicas
                body = {"model": "m", "max_tokens": 2, "stream": i % 2 == 1,
                        "messages": [{"role": "user", "content": "Say hello"}]}
                r = await http.post(CHAT, json=body, headers={"X-Grid-Affinity-Key": f"user-{i}"})
                assert r.status_code == 200, r.text
                assert r.headers["x-grid-host"] == "h1"
            stats = (await http.get("/gateway/stats")).json()
            assert stats["requests"]["not_served_there_retried"] >= 1, stats["requests"]
            assert stats["unroutable_hosts"] == []
            assert fleet.gw.breakers.state(("h2", "http://127.0.0.1:2", "m"), time.time()) == CLOSED

            # With no replica that serves, the client is told to retry (503), never a 502.
            await serving.stop()
            serving = InferenceResponder(agents[0].client, "h1", lambda m: None)
            await serving.start()
            r = await http.post(CHAT, json={"model": "m", "max_tokens": 2,
                                            "messages": [{"role": "user", "content": "Say hello"}]})
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] != "upstream_error"
    finally:
        await serving.stop()
        await draining.stop()
        await fleet.gw.upstream.aclose()
        for log in (*agents, gateway_log):
            await log.close()


async def test_a_client_that_leaves_right_after_the_final_event_had_a_whole_answer(pair) -> None:
    """The client reads `data: [DONE]` and hangs up before the agent's end-of-answer message is
    relayed (1 stream in 12 by hand): the stream is recorded as served, not as cancelled (499),
    which would have counted a complete answer as a failure in analytics and the dashboard.
    The test plays the HTTP server's side of ProxyStream: the hang-up lands while the gateway
    finishes the response after the final event."""
    upstream, _responder, _log = pair
    resp = await upstream.post(InferTarget("host-a", MODEL, CHAT), _chat(True), JSON)
    hung_up = asyncio.Event()
    outcomes: list[str] = []

    async def receive() -> dict[str, str]:
        await hung_up.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, object]) -> None:
        body = message.get("body", b"")
        if isinstance(body, bytes) and completes_event_stream(body):
            hung_up.set()  # the client has the final event and closes its connection
        elif message["type"] == "http.response.body" and not message.get("more_body"):
            await asyncio.sleep(0.2)  # the server is still writing when the hang-up is noticed

    stream = ProxyStream(resp.status_code, [(b"content-type", b"text/event-stream")], resp, lambda _c: None,
                         outcomes.append)
    await stream({"type": "http"}, receive, send)
    assert hung_up.is_set() and outcomes == [STREAM_OK]
