"""Real parts for gateway integration tests: llama.cpp engine children with engine keys, a gateway
served by uvicorn on a free loopback port over the real nats-server, real heartbeats, and the
agents' side of inference: a real `InferenceResponder` per host on its own NATS connection,
serving what that host's heartbeat says is ready (as the agent does), with that host's key."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from grid.agent.engines.runtime import Runtime
from grid.config import GridConfig
from grid.events import codec
from grid.events.base import new_event_id
from grid.events.control import ModelProfile, ProfileSet
from grid.events.host import HostHeartbeat, HostResources, Residency
from grid.events.log import EventLog
from grid.events.requests import RequestBatch, RequestCompleted, RequestFailed, RequestFeatures
from grid.events.subjects import CONTROL_STREAM, HOSTS_STREAM, PLANS_STREAM, REQUESTS_STREAM
from grid.gateway.app import RunningGateway, create_gateway_app, start_gateway
from grid.gateway.settings import GatewaySettings
from grid.infer.responder import EngineRoute, InferenceResponder
from grid.secrets import write_owner_only
from grid.transport.embedded import free_port
from grid.transport.jetstream import JetStreamLog

from tests.placement import Placements

MODEL = "smollm2"
# Engine endpoint -> its key, known only to the "agent" side of these tests (the gateway never
# sees a key). Engines not listed (scripted test servers) take no key.
ENGINE_KEYS: dict[str, str] = {}


@dataclass
class Engine:
    host_id: str
    endpoint: str
    key: str
    proc: Any


@pytest.fixture(scope="module")
def gw_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("gw-home")
    home.chmod(0o700)
    return home


@pytest.fixture(scope="session")
def smollm2_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from grid.agent.artifacts import ensure_bundled_model

    cache = tmp_path_factory.mktemp("model-cache")
    return ensure_bundled_model(GridConfig(home=cache, nats_url=None))


def _wait_health(endpoint: str, proc: Any, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the engine exited with {proc.returncode}")
        try:
            if httpx.get(f"{endpoint}/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the engine at {endpoint} never became healthy")


@pytest.fixture(scope="module")
def engines(gw_home: Path, smollm2_path: Path, engine_runtime: Runtime,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Engine]]:
    """Two real engine children (one per host id), each accepting only its engine key."""
    from grid.agent.engines.llama_cpp import EngineSpec, spawn

    logs = tmp_path_factory.mktemp("engine-logs")
    out: dict[str, Engine] = {}
    try:
        for host_id in ("host-a", "host-b"):
            key = secrets.token_hex(32)  # each host's own key, as an agent makes it
            key_file = logs / f"{host_id}.key"
            write_owner_only(key_file, (key + "\n").encode())
            spec = EngineSpec(model_id=MODEL, model_path=smollm2_path, port=free_port(), key_file=key_file,
                              slots=2, context_size=512, threads=1)
            proc = spawn(engine_runtime.command, spec, logs / f"{host_id}.log")
            out[host_id] = Engine(host_id, spec.endpoint, key, proc)
            ENGINE_KEYS[spec.endpoint] = key
        for engine in out.values():
            _wait_health(engine.endpoint, engine.proc)
        yield out
    finally:
        for engine in out.values():
            engine.proc.terminate()
        for engine in out.values():
            try:
                engine.proc.wait(10)
            except Exception:
                engine.proc.kill()


def ready(endpoint: str, *, model: str = MODEL, state: str = "ready", conc: int | None = 2,
          sha: str | None = None) -> Residency:
    return Residency(model_id=model, memory_mb=300, state=state, endpoint=endpoint, max_concurrency=conc,  # type: ignore[arg-type]
                     artifact_sha256=sha, loaded_age_seconds=5.0)


class HostAgents:
    """The agent side of inference for every host a test heartbeats: one NATS connection and
    one real responder per host, resolving only the models that host reported ready."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.routes: dict[str, dict[str, EngineRoute]] = {}
        self.logs: dict[str, JetStreamLog] = {}
        self.responders: dict[str, InferenceResponder] = {}

    async def report(self, host_id: str, residencies: tuple[Residency, ...]) -> None:
        self.routes[host_id] = {
            r.model_id: EngineRoute(r.endpoint, ENGINE_KEYS.get(r.endpoint, "no-key"))
            for r in residencies if r.state == "ready" and r.endpoint
        }
        if host_id not in self.responders:
            log = self.logs[host_id] = await JetStreamLog.connect(self.url, name=f"agent-{host_id}")
            routes = self.routes
            responder = InferenceResponder(log.client, host_id, lambda m: routes.get(host_id, {}).get(m))
            await responder.start()
            self.responders[host_id] = responder

    async def stop(self, host_id: str | None = None) -> None:
        for h in [host_id] if host_id else list(self.responders):
            responder = self.responders.pop(h, None)
            if responder is not None:
                await responder.stop()
            log = self.logs.pop(h, None)
            if log is not None:
                await asyncio.wait_for(log.close(), 5.0)


@dataclass
class Harness:
    log: EventLog
    home: Path
    running: RunningGateway
    http: httpx.AsyncClient
    client: openai.AsyncOpenAI
    agents: HostAgents
    extra: list[Any] = field(default_factory=list)
    # What a controller placed and the hosts acked: heartbeat() corroborates the claims it sends.
    placements: Placements = field(init=False)

    def __post_init__(self) -> None:
        self.placements = Placements(self.log)

    @property
    def url(self) -> str:
        return self.running.url

    async def heartbeat(self, host_id: str, *residencies: Residency, state: str = "accepting",
                        placed: bool = True) -> None:
        """Append `host_id`'s heartbeat; unless not `placed`, first the plan and warm ack that make
        its managed ready claims routable (as a real controller and agent would)."""
        if placed:
            await self.placements.corroborate(host_id, residencies)
        await self.log.append(HostHeartbeat(
            event_id=new_event_id(), at=time.time(), host_id=host_id, state=state,  # type: ignore[arg-type]
            resources=HostResources(capacity_mb=16000), residencies=residencies,
        ))
        await self.agents.report(host_id, residencies)
        await self.wait_projected()

    async def profile(self, profile: ModelProfile) -> None:
        await self.log.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=profile))
        await self.wait_projected()

    async def wait_projected(self, timeout: float = 10.0) -> None:
        want = {s: await self.log.last_sequence(s) for s in (HOSTS_STREAM, CONTROL_STREAM, PLANS_STREAM)}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            positions = (await self.stats())["projection"]["positions"]
            if all(positions.get(s, 0) >= seq for s, seq in want.items()):
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"the gateway never folded the log up to {want}")

    async def stats(self) -> dict[str, Any]:
        r = await self.http.get("/gateway/stats", headers=self.auth_headers())
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.client.api_key}"}

    async def served(self) -> dict[str, int]:
        return {f"{r['host_id']}": r["served"] for r in (await self.stats())["routes"]}

    async def records(self, *, want: Callable[[list[RequestFeatures]], bool] | None = None,
                      timeout: float = 5.0) -> list[RequestFeatures]:
        """Request features in the log (waiting up to `timeout` for `want` to hold)."""
        deadline = time.monotonic() + timeout
        while True:
            out: list[RequestFeatures] = []
            last = await self.log.last_sequence(REQUESTS_STREAM)
            if last:
                async for msg in self.log.replay(REQUESTS_STREAM):
                    event = codec.decode(msg.data)
                    if isinstance(event, RequestBatch):
                        out.extend(event.records)
                    elif isinstance(event, (RequestCompleted, RequestFailed)):
                        out.append(event.features)
            if want is None or want(out) or time.monotonic() > deadline:
                return out
            await asyncio.sleep(0.1)

    async def raw_request_log(self) -> bytes:
        chunks = []
        if await self.log.last_sequence(REQUESTS_STREAM):
            async for msg in self.log.replay(REQUESTS_STREAM):
                chunks.append(msg.data)
        return b"\n".join(chunks)


GatewayFactory = Callable[..., Awaitable[Harness]]


@pytest.fixture
async def make_gateway(js_log: EventLog, gw_home: Path) -> AsyncIterator[GatewayFactory]:
    made: list[Harness] = []

    async def make(*, log: EventLog | None = None, api_keys: list[str] | None = None,
                   settings: GatewaySettings | None = None) -> Harness:
        event_log = log or js_log
        app = create_gateway_app(event_log, GridConfig(home=gw_home, nats_url=None), api_keys=api_keys or [],
                                 settings=settings)
        running = await start_gateway(app, "127.0.0.1", 0)
        http = httpx.AsyncClient(base_url=running.url, timeout=30.0)
        client = openai.AsyncOpenAI(base_url=f"{running.url}/v1", api_key=(api_keys or ["sk-client-key"])[0],
                                    max_retries=0, timeout=60.0)
        url = event_log.client.connected_url  # type: ignore[attr-defined]
        agents = HostAgents(f"nats://{url.hostname}:{url.port}")
        h = Harness(event_log, gw_home, running, http, client, agents)
        made.append(h)
        return h

    yield make
    for h in made:
        await h.client.close()
        await h.http.aclose()
        await h.running.stop()
        with contextlib.suppress(Exception):
            await h.agents.stop()
