"""A request in flight ends within seconds when its host's path to NATS dies, never at the read timeout.

Real parts: a 3-node nats-server cluster, a real llama-server with the SmolLM2 GGUF, the gateway's
routes served by uvicorn over NATS, and two hosts' responders on connections of their own: h1 on
the gateway's node, h2 on another. With a long streamed answer and a long non-streamed one in
flight on h2:

- **killed**: h2's node is killed. The agent's connection is wired as the agent service wires it:
  it reconnects to another node and ends both answers saying it lost its connection
  (upstream_connection_lost), although what it sent meanwhile is gone (a gap in the stream).
- **partitioned**: h2's node is paused, and h2's connection neither pings soon nor reconnects: the
  host is cut off and nobody notices. The agent promised a progress marker at least every
  `wire.PROGRESS_MAX_GAP_SECONDS`, so the gateway ends both answers after PROGRESS_MISSES of those
  gaps (upstream_silent) and routes h2 nothing new until it heartbeats again.

Either way both answers end within 10 s with a retryable error although the read timeout is
120 s, and the next requests are answered at once. Before progress markers, a partitioned host's
answers stayed open until the read timeout (600 s in production), and a killed node's stream
ended as a gap with no error event.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import contextlib
import httpx
import nats
import pytest
import uvicorn
from starlette.applications import Starlette

from grid.gateway.routes import build_routes, exception_handlers
from grid.gateway.routing import EXCLUDED_SILENT
from grid.gateway.upstream import Upstream
from grid.infer.responder import EngineRoute, InferenceResponder
from grid.transport.cluster import NatsCluster
from grid.transport.jetstream import JetStreamLog
from tests.integration.infer.test_infer_over_nats import engine  # noqa: F401 - the fixture
from tests.unit.gateway.test_placed_routing import Fleet, fleet, ready  # noqa: F401 - the fixture

pytestmark = pytest.mark.engine

CHAT = "/v1/chat/completions"
# The goal for a request in flight on a host whose path died.
BOUND_SECONDS = 10.0
RETRYABLE = {(504, "upstream_silent"), (502, "upstream_connection_lost")}


def _long(stream: bool, max_tokens: int) -> dict[str, object]:
    return {"model": "m", "max_tokens": max_tokens, "stream": stream, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Count"}]}


async def _streamed_error(http: httpx.AsyncClient, started: asyncio.Event) -> tuple[int, str | None, float]:
    """A long stream on h2: (status, the error event's code, when it ended)."""
    async with http.stream("POST", CHAT, json=_long(True, 1500)) as r:
        assert r.headers.get("x-grid-host") == "h2", (r.status_code, await r.aread())
        code = None
        async for line in r.aiter_lines():
            started.set()
            if line.startswith("data: {\"error\""):
                code = json.loads(line[6:])["error"]["code"]
        return r.status_code, code, time.monotonic()


@contextlib.asynccontextmanager
async def _listening(app: Starlette) -> AsyncIterator[str]:
    """The gateway's routes on a loopback port: streams and client disconnects as a client sees them."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False,
                                           log_config=None, lifespan="off"))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        await task


async def _served_by_h2(fleet: Fleet, claim: object, http: httpx.AsyncClient) -> None:  # noqa: F811
    """h2's subscription takes a moment to reach the gateway's node; until then NATS answers "no
    responders" (and the gateway waits for h2's next heartbeat)."""
    deadline = time.monotonic() + 20
    while True:
        await fleet.heartbeat("h2", claim)
        r = await http.post(CHAT, json={"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
        if r.status_code == 200:
            return
        assert time.monotonic() < deadline, r.text
        await asyncio.sleep(0.2)


async def _heartbeating(fleet: Fleet, host: str, claim: object) -> None:  # noqa: F811
    """`host` heartbeats every second, as its agent would. h1 and h2 share one 2-slot engine,
    and h2's answers go on running there after its path died (nobody can tell h2 to stop), so
    the next requests wait behind them on a loaded machine: a single heartbeat went stale
    (30 s) before they were routed, and they failed 503 model_not_ready."""
    while True:
        await fleet.heartbeat(host, claim)
        await asyncio.sleep(1.0)


@pytest.mark.parametrize("fault", ["killed", "partitioned"])
async def test_a_request_in_flight_on_a_host_whose_path_died_ends_within_seconds(
        fault: str, nats_cluster: NatsCluster, fleet: Fleet, engine: EngineRoute) -> None:  # noqa: F811
    urls = nats_cluster.urls
    # The gateway and h1 on node 0, h2 on node 2.
    gateway_log = await JetStreamLog.connect(urls[0], name="gateway", ensure_streams=False)
    h1_log = await JetStreamLog.connect(urls[0], name="agent-h1", ensure_streams=False)
    h2_log = h2_nc = None
    if fault == "killed":
        h2_log = await JetStreamLog.connect(urls[2], name="agent-h2", ensure_streams=False)
    else:  # nats-py's defaults: a ping every 2 minutes, so a stalled server goes unnoticed
        h2_nc = await nats.connect(urls[2], name="agent-h2", allow_reconnect=False)
    resolve = lambda m: engine if m == "m" else None  # noqa: E731
    responders = {"h1": InferenceResponder(h1_log.client, "h1", resolve),
                  "h2": InferenceResponder(h2_log.client if h2_log is not None else h2_nc, "h2", resolve)}
    for host, log in (("h1", h1_log), ("h2", h2_log)):
        if log is not None:
            log.add_disconnect_listener(responders[host].connection_lost)  # as the agent service wires it
        await responders[host].start()
    app = Starlette(routes=build_routes(), exception_handlers=exception_handlers())
    app.state.gateway = fleet.gw
    fleet.gw.upstream = Upstream(backend="nats", nc=gateway_log.client, read_timeout=120.0)
    claims = {"h1": ready(managed=False, sha=None, port=1), "h2": ready(managed=False, sha=None, port=2)}
    h1_alive: asyncio.Task[None] | None = None
    try:
        await fleet.placements.admit("h2", [claims["h2"]])
        async with _listening(app) as url, httpx.AsyncClient(base_url=url, timeout=120, trust_env=False) as http:
            await _served_by_h2(fleet, claims["h2"], http)
            started = asyncio.Event()
            streamed = asyncio.create_task(_streamed_error(http, started))
            plain = asyncio.create_task(http.post(CHAT, json=_long(False, 400)))
            deadline = time.monotonic() + 30
            while responders["h2"].in_flight < 2 or not started.is_set():
                assert time.monotonic() < deadline, "the two answers never started on h2"
                await asyncio.sleep(0.05)
            await fleet.placements.admit("h1", [claims["h1"]])
            await fleet.heartbeat("h1", claims["h1"])
            h1_alive = asyncio.create_task(_heartbeating(fleet, "h1", claims["h1"]))

            t0 = time.monotonic()
            (nats_cluster.kill if fault == "killed" else nats_cluster.pause)(2)
            async with asyncio.timeout(60):  # far below the 120 s read timeout either way
                status, code, streamed_end = await streamed
                answer = await plain
            plain_end = time.monotonic()
            print(f"\n{fault}: stream ended after {streamed_end - t0:.1f}s ({code}), "
                  f"the non-streamed answer after {plain_end - t0:.1f}s ({answer.status_code})")
            assert status == 200 and code in {c for _, c in RETRYABLE}
            assert (answer.status_code, answer.json()["error"]["code"]) in RETRYABLE, answer.text
            assert "retry-after" in answer.headers
            assert max(streamed_end, plain_end) - t0 < BOUND_SECONDS
            if fault == "partitioned":  # the agent never said anything: its silence is the evidence
                assert code == "upstream_silent" and answer.status_code == 504
                assert ("h2", EXCLUDED_SILENT) in {(h["host_id"], h["reason"]) for h in
                                                   (await http.get("/gateway/stats")).json()["unroutable_hosts"]}

            # The next requests are answered at once: by h1 alone when h2 is cut off, though
            # h2's last heartbeat is still fresh (a reconnected h2 may serve its share).
            for i in range(4):
                r = await http.post(CHAT, json={"model": "m", "max_tokens": 2, "stream": i % 2 == 1,
                                                "messages": [{"role": "user", "content": "Say hello"}]},
                                    headers={"X-Grid-Affinity-Key": f"user-{i}"})
                print(f"next request {i} answered {time.monotonic() - t0:.1f}s after the fault ({r.status_code})")
                assert r.status_code == 200, r.text
                assert fault == "killed" or r.headers["x-grid-host"] == "h1"
            if fault == "partitioned":
                # A newer heartbeat is h2's proof that it is back.
                await fleet.heartbeat("h2", claims["h2"])
                assert "h2" in fleet.routes()
    finally:
        if h1_alive is not None:
            h1_alive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await h1_alive
        nats_cluster.resume(2)
        for responder in responders.values():
            await responder.stop()
        await fleet.gw.upstream.aclose()
        for log in (h1_log, h2_log, gateway_log):
            if log is not None:
                await log.close()
        if h2_nc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(h2_nc.close(), 5)


async def test_a_request_sent_while_the_gateways_own_node_is_silent_blames_no_host(
        nats_cluster: NatsCluster, fleet: Fleet, engine: EngineRoute) -> None:  # noqa: F811
    """The gateway's own node goes silent (paused; the gateway's connection neither pings soon
    nor reconnects). A request sent then gets no first message within the connect timeout, like a
    silent host's; but the gateway's own server does not answer a ping either, so the request
    fails as a lost connection (502 upstream_connection_lost, retryable) and no host is taken out
    of routing. Blaming the hosts took every host out of routing for 12 s when the gateway's
    node went silent in bench.serving_faults."""
    urls = nats_cluster.urls
    gateway_nc = await nats.connect(urls[0], name="gateway", allow_reconnect=False)
    h2_log = await JetStreamLog.connect(urls[2], name="agent-h2", ensure_streams=False)
    responder = InferenceResponder(h2_log.client, "h2", lambda m: engine if m == "m" else None)
    await responder.start()
    app = Starlette(routes=build_routes(), exception_handlers=exception_handlers())
    app.state.gateway = fleet.gw
    fleet.gw.upstream = Upstream(backend="nats", nc=gateway_nc, read_timeout=120.0)
    claim = ready(managed=False, sha=None, port=2)
    try:
        await fleet.placements.admit("h2", [claim])
        async with _listening(app) as url, httpx.AsyncClient(base_url=url, timeout=120, trust_env=False) as http:
            await _served_by_h2(fleet, claim, http)
            nats_cluster.pause(0)
            r = await http.post(CHAT, json={"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
            assert (r.status_code, r.json()["error"]["code"]) == (502, "upstream_connection_lost"), r.text
            stats = (await http.get("/gateway/stats")).json()
            assert stats["unroutable_hosts"] == [] and fleet.routes() == ["h2"]
    finally:
        nats_cluster.resume(0)
        await responder.stop()
        await fleet.gw.upstream.aclose()
        await h2_log.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(gateway_nc.close(), 5)
