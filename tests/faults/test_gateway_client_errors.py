"""Client-caused errors never take a model offline, and absurd sampling parameters never reach
an engine. A real llama-server (SmolLM2, chat only: started without --embeddings) behind the
gateway, over the real nats-server.

Incidents: one client sending an embeddings request every 0.5 s to a chat-only model made the
engine answer 501 each time; two such answers opened the breaker for the whole model, and chat
saw 30 failures out of 30. `max_tokens: -1` was passed upstream and became a 6.7 s generation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from grid.agent.engines.runtime import Runtime
from grid.config import GridConfig
from grid.events import codec
from grid.events.base import new_event_id
from grid.events.host import HostHeartbeat, HostResources, Residency
from grid.events.requests import RequestBatch, RequestFeatures
from grid.events.subjects import HOSTS_STREAM, PLANS_STREAM, REQUESTS_STREAM
from grid.gateway.app import create_gateway_app, start_gateway
from grid.gateway.settings import GatewaySettings
from grid.infer.responder import EngineRoute, InferenceResponder
from grid.secrets import load_or_create_secret
from grid.transport.embedded import free_port
from grid.transport.jetstream import JetStreamLog

from tests.placement import Placements

pytestmark = pytest.mark.slow

MODEL = "smollm2"
HOST = "fault-host"
CHAT = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gw-faults-home")
    path.chmod(0o700)
    return path


@pytest.fixture(scope="module")
def engine(home: Path, bundled_gguf: Path, engine_runtime: Runtime) -> Iterator[EngineRoute]:
    """One real chat-only llama-server accepting only HOST's own engine key; its route."""
    from grid.agent.engines.llama_cpp import EngineSpec, spawn

    key_file = home / "engine.key"
    key = load_or_create_secret(key_file)
    spec = EngineSpec(model_id=MODEL, model_path=bundled_gguf, port=free_port(), key_file=key_file, slots=2,
                      context_size=512, threads=1)
    proc = spawn(engine_runtime.command, spec, home / "llama.log")
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (home / "llama.log").read_text()[-2000:]
            try:
                if httpx.get(f"{spec.endpoint}/health", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "llama-server never became healthy"
            time.sleep(0.2)
        yield EngineRoute(spec.endpoint, key)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except Exception:
            proc.kill()


class Gateway:
    def __init__(self, log: JetStreamLog, http: httpx.AsyncClient) -> None:
        self.log = log
        self.http = http

    async def stats(self) -> dict[str, Any]:
        return (await self.http.get("/gateway/stats")).json()  # type: ignore[no-any-return]

    async def records(self, count: int) -> list[RequestFeatures]:
        deadline = time.monotonic() + 10
        while True:
            out: list[RequestFeatures] = []
            if await self.log.last_sequence(REQUESTS_STREAM):
                async for msg in self.log.replay(REQUESTS_STREAM):
                    event = codec.decode(msg.data)
                    if isinstance(event, RequestBatch):
                        out.extend(event.records)
            if len(out) >= count or time.monotonic() > deadline:
                return out
            await asyncio.sleep(0.05)


@pytest.fixture
async def gateway(js_log: JetStreamLog, home: Path, engine: EngineRoute,
                  nats_server: Any) -> AsyncIterator[Gateway]:
    # HOST's agent side of inference, on its own connection: the gateway reaches the engine only through it.
    agent_log = await JetStreamLog.connect(nats_server.url, name="agent-fault-host")
    responder = InferenceResponder(agent_log.client, HOST, lambda m: engine if m == MODEL else None)
    await responder.start()
    app = create_gateway_app(js_log, GridConfig(home=home, nats_url=None), api_keys=[],
                             settings=GatewaySettings(telemetry_flush_seconds=0.05))
    running = await start_gateway(app, "127.0.0.1", 0, write_url_file=False)
    async with httpx.AsyncClient(base_url=running.url, timeout=60.0) as http:
        gw = Gateway(js_log, http)
        await Placements(js_log).place(HOST, MODEL)  # the controller's plan and the host's warm ack
        await js_log.append(HostHeartbeat(
            event_id=new_event_id(), at=time.time(), host_id=HOST, resources=HostResources(capacity_mb=16000),
            residencies=(Residency(model_id=MODEL, memory_mb=300, state="ready", endpoint=engine.endpoint,
                                 max_concurrency=2),),
        ))
        want = {s: await js_log.last_sequence(s) for s in (HOSTS_STREAM, PLANS_STREAM)}
        for _ in range(500):
            positions = (await gw.stats())["projection"]["positions"]
            if all(positions.get(s, 0) >= seq for s, seq in want.items()):
                break
            await asyncio.sleep(0.02)
        yield gw
    await running.stop()
    await responder.stop()
    await agent_log.close()


async def test_embeddings_on_a_chat_only_model_never_open_the_breaker(gateway: Gateway) -> None:
    for _ in range(4):
        r = await gateway.http.post("/v1/embeddings", json={"model": MODEL, "input": "hello"})
        # the engine's own explanation reaches the caller, with its status
        assert r.status_code == 501, r.text
        assert r.json()["error"]["type"] == "not_supported_error"
    assert [c["circuit"] for c in (await gateway.stats())["routes"]] == ["closed"]

    r = await gateway.http.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT, "max_tokens": 2})
    assert r.status_code == 200, r.text
    records = await gateway.records(5)
    assert [(x.endpoint, x.outcome, x.status_code) for x in records] == \
        [("embeddings", "rejected", 501)] * 4 + [("chat", "ok", 200)]


@pytest.mark.parametrize("path,field,value", [
    ("/v1/chat/completions", "max_tokens", -1),
    ("/v1/chat/completions", "max_tokens", 0),
    ("/v1/chat/completions", "max_completion_tokens", 10**9),
    ("/v1/chat/completions", "temperature", 7.5),
    ("/v1/chat/completions", "top_p", -0.5),
    ("/v1/chat/completions", "n", 0),
    ("/v1/completions", "max_tokens", -1),
    ("/v1/completions", "frequency_penalty", 3),
])
async def test_out_of_range_sampling_parameters_are_a_400_and_never_reach_the_engine(
    gateway: Gateway, path: str, field: str, value: float
) -> None:
    body: dict[str, Any] = {"model": MODEL, field: value}
    body.update({"messages": CHAT} if path.endswith("chat/completions") else {"prompt": "Once"})
    t0 = time.monotonic()
    r = await gateway.http.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["type"], err["param"], err["code"]) == ("invalid_request_error", field, "value_out_of_range")
    assert time.monotonic() - t0 < 2.0  # refused, not generated
    assert all(route["served"] == 0 for route in (await gateway.stats())["routes"])


async def test_parameters_within_their_bounds_still_pass(gateway: Gateway) -> None:
    r = await gateway.http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": CHAT, "max_tokens": 2, "temperature": 0, "top_p": 1, "n": 1,
        "presence_penalty": -2, "frequency_penalty": 2, "top_k": 40, "min_p": 0.05,
    })
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 2
