"""The proxy path against scripted loopback engines: exactly-once POSTs and the telemetry record.

The gateway is served by uvicorn over the in-process log twin; each engine is a real asyncio
server that reads the request and answers (or hangs up) as its script says.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from grid.config import GridConfig
from grid.events import codec
from grid.events.base import new_event_id
from grid.events.control import ModelProfile, ProfileSet
from grid.events.host import Residency
from grid.events.log import InMemoryLog
from grid.events.requests import RequestBatch, RequestFeatures
from grid.events.subjects import CONTROL_STREAM, HOSTS_STREAM, PLANS_STREAM, REQUESTS_STREAM
from grid.gateway.app import RunningGateway, create_gateway_app, start_gateway
from grid.gateway.settings import GatewaySettings

from tests.placement import Placements
from tests.heartbeats import heartbeat

CHAT = "/v1/chat/completions"
OK_BODY = b'{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}'


class ScriptedEngine:
    """Reads whole requests; `answer(n)` gives the raw reply to the n-th one (None: hang up)."""

    def __init__(self, answer: Callable[[int], bytes | None]) -> None:
        self.answer = answer
        self.requests: list[bytes] = []
        self.connections = 0
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> ScriptedEngine:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    @property
    def endpoint(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                self.requests.append(head + await reader.readexactly(length))
                out = self.answer(len(self.requests))
                if out is None:
                    break
                writer.write(out)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def ok_reply(_: int) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(OK_BODY), OK_BODY)


class Served:
    def __init__(self, log: InMemoryLog, running: RunningGateway, http: httpx.AsyncClient) -> None:
        self.log = log
        self.running = running
        self.http = http
        self.placements = Placements(log)

    async def heartbeat(self, host_id: str, endpoint: str, model: str = "m") -> None:
        residencies = (Residency(model_id=model, memory_mb=300, state="ready", endpoint=endpoint,
                                 max_concurrency=4),)
        await self.placements.corroborate(host_id, residencies)  # what a controller placed, the host acked
        await self.log.append(heartbeat(host_id, *residencies))
        await self.projected()

    async def profile(self, profile: ModelProfile) -> None:
        await self.log.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=profile))
        await self.projected()

    async def projected(self) -> None:
        want = {s: await self.log.last_sequence(s) for s in (HOSTS_STREAM, CONTROL_STREAM, PLANS_STREAM)}
        for _ in range(500):
            positions = (await self.http.get("/gateway/stats")).json()["projection"]["positions"]
            if all(positions.get(s, 0) >= seq for s, seq in want.items()):
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the gateway never folded the log")

    async def records(self, count: int) -> list[RequestFeatures]:
        for _ in range(300):
            out: list[RequestFeatures] = []
            async for msg in self.log.replay(REQUESTS_STREAM):
                event = codec.decode(msg.data)
                if isinstance(event, RequestBatch):
                    out.extend(event.records)
            if len(out) >= count:
                return out
            await asyncio.sleep(0.02)
        raise AssertionError(f"fewer than {count} request records reached the log")


@pytest.fixture(params=["h1", "httpx"])
async def served(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Served]:
    log = InMemoryLog()
    settings = GatewaySettings(upstream_backend=request.param, telemetry_flush_seconds=0.05)
    app = create_gateway_app(log, GridConfig(home=tmp_path, nats_url=None), api_keys=[], settings=settings)
    running = await start_gateway(app, "127.0.0.1", 0, write_url_file=False)
    async with httpx.AsyncClient(base_url=running.url, timeout=10.0) as http:
        yield Served(log, running, http)
    await running.stop()


@pytest.fixture
async def engines() -> AsyncIterator[list[ScriptedEngine]]:
    made: list[ScriptedEngine] = []
    yield made
    for e in made:
        await e.stop()


MSG = {"model": "m", "messages": [{"role": "user", "content": "x"}]}


async def test_an_engine_that_hangs_up_sees_the_post_exactly_once(served: Served,
                                                                  engines: list[ScriptedEngine]) -> None:
    hangup = await ScriptedEngine(lambda n: None).start()
    engines.append(hangup)
    await served.heartbeat("h-hangup", hangup.endpoint)
    r = await served.http.post(CHAT, json=MSG)
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_error"
    assert len(hangup.requests) == 1 and hangup.connections == 1


async def test_a_pooled_connection_that_breaks_is_not_replayed(served: Served,
                                                               engines: list[ScriptedEngine]) -> None:
    # First request: a keep-alive answer (the connection goes back to the pool).
    # Second request, on that pooled connection: the engine reads it and hangs up.
    engine = await ScriptedEngine(lambda n: ok_reply(n) if n == 1 else None).start()
    engines.append(engine)
    await served.heartbeat("h-once", engine.endpoint)
    assert (await served.http.post(CHAT, json=MSG)).status_code == 200
    r = await served.http.post(CHAT, json=MSG)
    assert r.status_code == 502
    assert len(engine.requests) == 2 and engine.connections == 1


async def test_telemetry_carries_the_double_hash_of_the_affinity_key(served: Served,
                                                                     engines: list[ScriptedEngine]) -> None:
    key = b"user-77/session-3"
    expected = hashlib.sha256(hashlib.sha256(key).digest()).hexdigest()
    await served.profile(ModelProfile(model_id="m", memory_mb=300, workload_scores={"general": 0.5}))
    # model "auto" with nothing ready: a demand record, no route
    r = await served.http.post(CHAT, json={**MSG, "model": "auto"}, headers={"X-Grid-Affinity-Key": key.decode()})
    assert r.status_code == 503
    engine = await ScriptedEngine(ok_reply).start()
    engines.append(engine)
    await served.heartbeat("h-ok", engine.endpoint)
    # model "auto" routed, and a direct request (which carries no session hash)
    r = await served.http.post(CHAT, json={**MSG, "model": "auto"}, headers={"X-Grid-Affinity-Key": key.decode()})
    assert r.status_code == 200
    r = await served.http.post(CHAT, json=MSG, headers={"X-Grid-Affinity-Key": key.decode()})
    assert r.status_code == 200

    demand, routed, direct = await served.records(3)
    assert (demand.auto, demand.outcome, demand.affinity) == (True, "unavailable", expected)
    assert (routed.auto, routed.outcome, routed.affinity) == (True, "ok", expected)
    assert (direct.auto, direct.affinity) == (False, None)
