"""The gateway end to end on loopback: official openai client -> gateway (uvicorn) -> NATS ->
each host's inference responder -> real llama-server children (each host's own engine key),
with real heartbeats and request features in a real nats-server."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator

import httpx
import openai
import pytest

from grid.agent.engines.llama_cpp import probe_active
from grid.events.control import ModelProfile
from grid.gateway.settings import GatewaySettings
from grid.gateway.telemetry import APPEND_TIMEOUT_SECONDS
from grid.transport.embedded import EmbeddedNats, free_port
from grid.transport.jetstream import JetStreamLog

from .conftest import MODEL, Engine, GatewayFactory, ready

pytestmark = pytest.mark.slow

PROMPT_MARKER = "zebra-quartz-7731"


async def test_models_lists_only_admitted_ready_models(make_gateway: GatewayFactory,
                                                       engines: dict[str, Engine]) -> None:
    gw = await make_gateway()
    a, b = engines["host-a"], engines["host-b"]
    await gw.heartbeat("host-a", ready(a.endpoint), ready(a.endpoint, model="still-loading", state="loading"),
                       ready(a.endpoint, model="on-its-way-out", state="draining"))
    await gw.heartbeat("host-b", ready(b.endpoint, model="fenced-host-model"), state="paused")
    models = await gw.client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert (await gw.client.models.retrieve(MODEL)).id == MODEL
    with pytest.raises(openai.NotFoundError):
        await gw.client.models.retrieve("still-loading")

    # gridctl models (explicit --gateway URL: the root, or the OpenAI base URL `gridctl up` prints;
    # then the recorded gateway.url)
    for url in (gw.url, f"{gw.url}/v1", f"{gw.url}/v1/"):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "grid.cli.main", "models", "--json", "--gateway", url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        assert proc.returncode == 0, (url, err.decode())
        assert [m["id"] for m in json.loads(out)] == [MODEL]
    env = {k: v for k, v in os.environ.items() if k != "GRID_GATEWAY_URL"}
    env["GRID_HOME"] = str(gw.home)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "grid.cli.main", "models", "--json", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert [m["id"] for m in json.loads(out)] == [MODEL]


async def test_chat_streaming_and_telemetry(make_gateway: GatewayFactory, engines: dict[str, Engine]) -> None:
    gw = await make_gateway()
    a = engines["host-a"]
    await gw.heartbeat("host-a", ready(a.endpoint, sha="f" * 64))
    messages = [{"role": "user", "content": f"Say hello to {PROMPT_MARKER}."}]
    # The client sends its own Authorization (sk-client-key); the engine only accepts its host's
    # engine key, so a 200 proves the host's agent added it on the private hop.
    reply = await gw.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,  # type: ignore[arg-type]
                                                    extra_headers={"X-Grid-Affinity-Key": "session-1"})
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens > 0

    stream = await gw.client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )
    pieces, usage = [], None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(pieces) and usage is not None and usage.completion_tokens > 0

    completion = await gw.client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4)
    assert completion.choices[0].text is not None

    recs = await gw.records(want=lambda rs: len(rs) >= 3)
    assert len(recs) == 3
    plain, streamed, legacy = recs
    assert (plain.endpoint, plain.streamed, plain.outcome, plain.host_id) == ("chat", False, "ok", "host-a")
    assert plain.served_model == MODEL and plain.output_units == reply.usage.completion_tokens
    assert plain.artifact_sha256 == "f" * 64 and plain.input_units > 0 and plain.service_seconds > 0
    assert plain.affinity is None  # direct requests carry no session hash
    assert streamed.streamed and streamed.outcome == "ok" and streamed.output_units == usage.completion_tokens
    assert legacy.endpoint == "completions"
    raw = await gw.raw_request_log()
    for secret in (PROMPT_MARKER.encode(), b"session-1", b"sk-client-key", a.key.encode()):
        assert secret not in raw

    stats = await gw.stats()
    assert stats["last_used_at"][MODEL] > time.time() - 60
    route = stats["routes"][0]
    assert route["host_id"] == "host-a" and route["served"] == 3 and route["active"] == 0
    assert a.key not in json.dumps(stats)

    # gridctl chat streams tokens to the terminal
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "grid.cli.main", "chat", "-m", MODEL, "--max-tokens", "6", "--gateway", gw.url,
        "Say hi.", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert out.strip()


async def test_unknown_model_is_model_not_found(make_gateway: GatewayFactory, engines: dict[str, Engine]) -> None:
    gw = await make_gateway()
    await gw.heartbeat("host-a", ready(engines["host-a"].endpoint))
    with pytest.raises(openai.NotFoundError) as err:
        await gw.client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert err.value.code == "model_not_found"
    assert err.value.body["type"] == "invalid_request_error"  # type: ignore[index]


async def test_auto_with_nothing_ready_is_an_honest_503_and_records_demand(
    make_gateway: GatewayFactory, engines: dict[str, Engine]
) -> None:
    gw = await make_gateway()
    await gw.heartbeat("host-a", ready(engines["host-a"].endpoint))  # ready, but scores no workload
    await gw.profile(ModelProfile(model_id="coder-7b", memory_mb=4000, workload_scores={"coding": 0.9},
                                  load_seconds=20.0, warm_seconds=10.0))
    coding = [{"role": "user", "content": "Fix this Python function:\n```python\ndef add(a, b):\n    return a - b\n```"}]
    with pytest.raises(openai.APIStatusError) as err:
        await gw.client.chat.completions.create(model="auto", messages=coding, max_tokens=4,  # type: ignore[arg-type]
                                                extra_headers={"X-Grid-Affinity-Key": "user-77/session-3"})
    assert err.value.status_code == 503 and err.value.code == "model_not_ready"
    assert err.value.response.headers["retry-after"] == "30"  # the configured cold start

    recs = await gw.records(want=lambda rs: len(rs) >= 1)
    assert len(recs) == 1
    demand = recs[0]
    assert (demand.auto, demand.outcome, demand.workload, demand.requested_model) == (True, "unavailable", "coding", "auto")
    assert demand.status_code == 503 and demand.served_model is None and demand.host_id is None
    # the double hash (hex) of the key, never the routing digest itself
    assert demand.affinity == hashlib.sha256(hashlib.sha256(b"user-77/session-3").digest()).hexdigest()
    assert b"user-77" not in await gw.raw_request_log()

    # Once a ready model scores the workload (here through "general"), auto routes to it.
    await gw.profile(ModelProfile(model_id=MODEL, memory_mb=300, workload_scores={"general": 0.5}))
    reply = await gw.client.chat.completions.create(model="auto", messages=coding, max_tokens=4)  # type: ignore[arg-type]
    assert reply.choices[0].message.content is not None
    recs = await gw.records(want=lambda rs: len(rs) >= 2)
    served = recs[1]
    assert (served.auto, served.outcome, served.served_model, served.workload) == (True, "ok", MODEL, "coding")


async def test_drain_during_a_stream(make_gateway: GatewayFactory, engines: dict[str, Engine]) -> None:
    gw = await make_gateway()
    a, b = engines["host-a"], engines["host-b"]
    await gw.heartbeat("host-a", ready(a.endpoint))
    await gw.heartbeat("host-b", ready(b.endpoint))
    stream = await gw.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell a long story."}], max_tokens=96,  # type: ignore[arg-type]
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )
    it = stream.__aiter__()
    first = await it.__anext__()
    assert first.choices
    active = [r for r in (await gw.stats())["routes"] if r["active"] == 1]
    assert len(active) == 1
    busy = active[0]["host_id"]
    other = "host-b" if busy == "host-a" else "host-a"
    busy_engine = engines[busy]

    # The busy host's residency starts draining while the stream is running.
    await gw.heartbeat(busy, ready(busy_engine.endpoint, state="draining"))
    before = await gw.served()
    for _ in range(3):
        r = await gw.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                    max_tokens=2)
        assert r.choices
    after = await gw.served()
    assert after.get(busy) == before.get(busy) and after.get(other, 0) == before.get(other, 0) + 3

    # The in-flight stream still completes on the draining engine.
    chunks, usage, finish = 1, None, None
    async for chunk in it:
        chunks += 1
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
        if chunk.usage is not None:
            usage = chunk.usage
    assert finish == "length" and usage is not None and usage.completion_tokens == 96 and chunks > 90
    recs = await gw.records(want=lambda rs: len(rs) >= 4)
    streamed = [r for r in recs if r.streamed]
    assert len(streamed) == 1 and streamed[0].outcome == "ok" and streamed[0].host_id == busy

    # Only the draining engine left: new requests are refused honestly, not routed to it.
    await gw.heartbeat(other, ready(engines[other].endpoint, state="draining"))
    with pytest.raises(openai.APIStatusError) as err:
        await gw.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert err.value.status_code == 503 and "retry-after" in err.value.response.headers
    assert [m.id for m in (await gw.client.models.list()).data] == []


class FakeFailingEngine:
    """A real local HTTP server answering chat completions with a chosen status."""

    BODY = json.dumps({
        "id": "x", "object": "chat.completion", "created": 0, "model": "flaky",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"completion_tokens": 1, "prompt_tokens": 1, "total_tokens": 2},
    }).encode()

    def __init__(self, status: int, delay: float = 0.0) -> None:
        self.status = status
        self.delay = delay
        self.posts = 0
        self.port = 0
        self.server: asyncio.AbstractServer | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> FakeFailingEngine:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)  # no free-port race
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                self.posts += 1
                if self.delay:
                    await asyncio.sleep(self.delay)
                body = self.BODY if self.status == 200 else json.dumps(
                    {"error": {"message": "boom", "type": "server_error", "code": None, "param": None}}).encode()
                writer.write(b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (self.status, len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.fixture
async def flaky() -> AsyncIterator[list[FakeFailingEngine]]:
    servers: list[FakeFailingEngine] = []
    yield servers
    for s in servers:
        await s.stop()


async def test_breaker_opens_on_5xx_redirects_and_recovers(make_gateway: GatewayFactory,
                                                           flaky: list[FakeFailingEngine]) -> None:
    gw = await make_gateway()
    bad = await FakeFailingEngine(500).start()
    flaky.append(bad)
    await gw.heartbeat("a-bad", ready(bad.endpoint, model="flaky", conc=4))
    msg = [{"role": "user", "content": "x"}]

    for _ in range(2):  # two consecutive 5xx: each fails once, never replayed
        with pytest.raises(openai.APIStatusError) as err:
            await gw.client.chat.completions.create(model="flaky", messages=msg)  # type: ignore[arg-type]
        assert err.value.status_code == 502 and err.value.code == "upstream_error"
    assert bad.posts == 2
    with pytest.raises(openai.APIStatusError) as err:  # open: no request reaches the engine
        await gw.client.chat.completions.create(model="flaky", messages=msg)  # type: ignore[arg-type]
    assert err.value.status_code == 503 and err.value.code == "upstream_unavailable"
    assert int(err.value.response.headers["retry-after"]) >= 1
    assert bad.posts == 2
    assert [r["circuit"] for r in (await gw.stats())["routes"]] == ["open"]

    # A healthy peer for the same model takes the subsequent requests at once.
    good = await FakeFailingEngine(200).start()
    flaky.append(good)
    await gw.heartbeat("b-good", ready(good.endpoint, model="flaky", conc=4))
    for _ in range(3):
        r = await gw.client.chat.completions.create(model="flaky", messages=msg)  # type: ignore[arg-type]
        assert r.choices[0].message.content == "ok"
    assert good.posts == 3 and bad.posts == 2

    # The bad engine recovers: after the 1 s cooldown one half-open probe closes the circuit.
    bad.status = 200
    await gw.heartbeat("b-good", ready(good.endpoint, model="flaky", state="draining"))
    await asyncio.sleep(1.1)
    r = await gw.client.chat.completions.create(model="flaky", messages=msg)  # type: ignore[arg-type]
    assert r.choices[0].message.content == "ok" and bad.posts == 3
    assert {r["host_id"]: r["circuit"] for r in (await gw.stats())["routes"]}["a-bad"] == "closed"

    recs = await gw.records(want=lambda rs: len(rs) >= 7)
    assert [r.outcome for r in recs] == ["error", "error", "unavailable", "ok", "ok", "ok", "ok"]


async def test_429_opens_for_a_second_and_caller_4xx_does_not(make_gateway: GatewayFactory,
                                                             flaky: list[FakeFailingEngine]) -> None:
    gw = await make_gateway()
    eng = await FakeFailingEngine(429).start()
    flaky.append(eng)
    await gw.heartbeat("h-429", ready(eng.endpoint, model="limited", conc=4))
    msg = [{"role": "user", "content": "x"}]
    with pytest.raises(openai.RateLimitError):
        await gw.client.chat.completions.create(model="limited", messages=msg)  # type: ignore[arg-type]
    eng.status = 200
    with pytest.raises(openai.APIStatusError) as err:
        await gw.client.chat.completions.create(model="limited", messages=msg)  # type: ignore[arg-type]
    assert err.value.status_code == 503 and eng.posts == 1
    await asyncio.sleep(1.05)
    assert (await gw.client.chat.completions.create(model="limited", messages=msg)).choices  # type: ignore[arg-type]

    eng.status = 400  # caller-caused errors never open the circuit
    for _ in range(4):
        with pytest.raises(openai.BadRequestError):
            await gw.client.chat.completions.create(model="limited", messages=msg)  # type: ignore[arg-type]
    assert eng.posts == 6
    assert [r["circuit"] for r in (await gw.stats())["routes"]] == ["closed"]


async def test_client_api_keys(make_gateway: GatewayFactory, engines: dict[str, Engine]) -> None:
    gw = await make_gateway(api_keys=["client-key-1"])
    await gw.heartbeat("host-a", ready(engines["host-a"].endpoint))
    assert (await gw.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)).choices
    wrong = gw.client.with_options(api_key="wrong")
    with pytest.raises(openai.AuthenticationError):
        await wrong.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        await wrong.models.list()


async def test_nats_down_fails_requests_fast_and_honestly(make_gateway: GatewayFactory, engines: dict[str, Engine],
                                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    """Inference rides NATS: with the server gone, requests fail within the connect timeout
    (no hang, no replay), and telemetry keeps its records for a later flush."""
    server = EmbeddedNats(tmp_path_factory.mktemp("nats-down")).start()
    log = await JetStreamLog.connect(server.url)
    try:
        gw = await make_gateway(log=log, settings=GatewaySettings(upstream_connect_timeout=1.0))
        await gw.heartbeat("host-a", ready(engines["host-a"].endpoint))
        msg = [{"role": "user", "content": "Hi"}]
        assert (await gw.client.chat.completions.create(model=MODEL, messages=msg, max_tokens=2)).choices
        server.stop()
        for _ in range(3):
            t0 = time.monotonic()
            with pytest.raises(openai.APIStatusError) as err:
                await gw.client.chat.completions.create(model=MODEL, messages=msg, max_tokens=2)
            assert err.value.status_code in (502, 503, 504) and time.monotonic() - t0 < 5.0
        # A flush attempt fails in the background (within a flush interval and an append timeout),
        # and the records wait for the next one.
        deadline = time.monotonic() + GatewaySettings().telemetry_flush_seconds + APPEND_TIMEOUT_SECONDS + 10
        while (tel := (await gw.stats())["telemetry"])["failed_appends"] < 1:
            assert time.monotonic() < deadline, f"no flush attempt failed: {tel}"
            await asyncio.sleep(0.1)
        assert tel["accepted"] >= 2
        assert tel["queued"] + tel["pending_retry"] >= 1
    finally:
        server.stop()
        try:
            await asyncio.wait_for(log.close(), 1.0)
        except Exception:
            pass


async def test_full_routes_queue_briefly_then_answer_honestly(make_gateway: GatewayFactory,
                                                               flaky: list[FakeFailingEngine]) -> None:
    gw = await make_gateway(settings=GatewaySettings(queue_timeout_seconds=0.7))
    eng = await FakeFailingEngine(200, delay=0.45).start()
    flaky.append(eng)
    await gw.heartbeat("h-one-slot", ready(eng.endpoint, model="narrow", conc=1))
    msg = [{"role": "user", "content": "x"}]

    async def call() -> str:
        try:
            await gw.client.chat.completions.create(model="narrow", messages=msg)  # type: ignore[arg-type]
            return "ok"
        except openai.APIStatusError as exc:
            return f"{exc.status_code}:{exc.code}"

    # two at once on one slot: the second waits for the first instead of overrunning the engine
    assert await asyncio.gather(call(), call()) == ["ok", "ok"]
    recs = await gw.records(want=lambda rs: len(rs) >= 2)
    assert sorted(r.queue_seconds > 0.1 for r in recs) == [False, True]
    # three at once: the third cannot get the slot within the queue timeout
    results = await asyncio.gather(call(), call(), call())
    assert sorted(results) == ["503:model_at_capacity", "ok", "ok"]
    assert eng.posts == 4


async def test_client_disconnect_mid_stream_releases_the_route(make_gateway: GatewayFactory,
                                                               engines: dict[str, Engine]) -> None:
    gw = await make_gateway()
    await gw.heartbeat("host-a", ready(engines["host-a"].endpoint))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 400,
            "stream": True, "ignore_eos": True}
    async with gw.http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                break
        assert [x["active"] for x in (await gw.stats())["routes"]] == [1]
    # the client went away: the gateway stops reading upstream and frees the slot
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if [x["active"] for x in (await gw.stats())["routes"]] == [0]:
            break
        await asyncio.sleep(0.05)
    assert [x["active"] for x in (await gw.stats())["routes"]] == [0]
    recs = await gw.records(want=lambda rs: len(rs) >= 1)
    assert recs[0].outcome == "cancelled" and recs[0].streamed and recs[0].output_units < 400
    # ... and the host's agent dropped its engine connection: the engine slot is free again.
    engine = engines["host-a"]
    async with httpx.AsyncClient() as c:
        for _ in range(100):
            if await probe_active(c, engine.endpoint, engine.key) == 0:
                break
            await asyncio.sleep(0.05)
        assert await probe_active(c, engine.endpoint, engine.key) == 0


async def test_a_dead_engine_port_is_a_502_then_an_open_circuit(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway()
    await gw.heartbeat("h-dead", ready(f"http://127.0.0.1:{free_port()}", model="gone", conc=4))
    msg = [{"role": "user", "content": "x"}]
    codes = []
    for _ in range(3):
        with pytest.raises(openai.APIStatusError) as err:
            await gw.client.chat.completions.create(model="gone", messages=msg)  # type: ignore[arg-type]
        codes.append((err.value.status_code, err.value.code))
    assert codes == [(502, "upstream_error"), (502, "upstream_error"), (503, "upstream_unavailable")]


async def test_http_backends_hold_no_engine_key_so_a_hosts_engine_refuses_them(
        make_gateway: GatewayFactory, engines: dict[str, Engine]) -> None:
    """The gateway has no engine key to send: going straight to an engine's loopback URL with
    an HTTP pool is refused by the engine; only the host's agent can reach it."""
    for backend in ("httpx", "h1"):
        gw = await make_gateway(settings=GatewaySettings(upstream_backend=backend))
        await gw.heartbeat("host-b", ready(engines["host-b"].endpoint))
        with pytest.raises(openai.APIStatusError) as err:
            await gw.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],  # type: ignore[arg-type]
                                                    max_tokens=3)
        assert err.value.status_code == 502 and "engine key" in err.value.message


async def test_each_host_serves_through_its_agent_and_says_so(make_gateway: GatewayFactory,
                                                               engines: dict[str, Engine]) -> None:
    gw = await make_gateway()
    a, b = engines["host-a"], engines["host-b"]
    seen: list[tuple[str, bytes, dict[str, str]]] = []
    tap = await JetStreamLog.connect(gw.agents.url, name="tap")

    async def capture(m) -> None:  # type: ignore[no-untyped-def]
        seen.append((m.subject, m.data, dict(m.headers or {})))

    await tap.client.subscribe("grid.infer.>", cb=capture)
    await tap.client.subscribe("_INBOX.>", cb=capture)
    await tap.client.flush()
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        await gw.heartbeat("host-a", ready(a.endpoint))
        r = await gw.http.post("/v1/chat/completions", json=body, headers=gw.auth_headers())
        assert r.status_code == 200 and r.headers["x-grid-host"] == "host-a"
        await gw.heartbeat("host-a", ready(a.endpoint, state="draining"))
        await gw.heartbeat("host-b", ready(b.endpoint))
        async with gw.http.stream("POST", "/v1/chat/completions", json={**body, "stream": True},
                                  headers=gw.auth_headers()) as r:
            assert r.status_code == 200 and r.headers["x-grid-host"] == "host-b"
            assert "data: [DONE]" in (await r.aread()).decode()
        assert gw.agents.responders["host-a"].served == 1 and gw.agents.responders["host-b"].served == 1
    finally:
        await tap.close()
    # Requests went to each host's own subject; no engine key was ever on the wire, and the
    # gateway's home holds no engine secret to derive one from.
    assert {s for s, _, _ in seen if s.startswith("grid.infer.")} == {"grid.infer.host-a.req", "grid.infer.host-b.req"}
    for _subject, data, headers in seen:
        for key in (a.key, b.key):
            assert key.encode() not in data and key not in json.dumps(headers)
    assert not (gw.home / "engine.secret").exists()
