"""A real agent serves its engine over NATS with a key of its own: the gateway's side
(`NatsUpstream`, on another connection) reaches the engine without knowing any key."""

from __future__ import annotations

import asyncio
import json

import pytest

from grid.agent.artifacts import BUNDLED_MODEL_ID, BUNDLED_SHA256
from grid.config import GridConfig
from grid.infer.client import InferTarget, NatsUpstream, NotServedThere
from grid.secrets import ENGINE_SECRET_FILE, engine_key, load_or_create_secret
from grid.transport.jetstream import JetStreamLog
from tests.integration.agent.agentkit import HOST, make_command, wait_ack, wait_for

pytestmark = pytest.mark.e2e

CHAT = "/v1/chat/completions"
JSON = [(b"content-type", b"application/json")]


async def test_agent_serves_ready_models_over_nats_with_its_own_key(js_log: JetStreamLog, start_agent,
                                                                     grid_config: GridConfig, nats_server) -> None:
    # The drain below waits for three streams: as long as a loaded CI machine needs.
    agent = await start_agent(drain_deadline=240.0)
    key = agent.paths.engine_key.read_text().strip()
    # Not derived from anything another machine could hold: a random key made by this agent.
    assert key != engine_key(load_or_create_secret(grid_config.home / ENGINE_SECRET_FILE), HOST)
    assert agent.paths.engine_key.stat().st_mode & 0o077 == 0

    gateway_log = await JetStreamLog.connect(nats_server.url, name="gateway")
    upstream = NatsUpstream(gateway_log.client, connect_timeout=3.0, read_timeout=120.0)
    body = json.dumps({"model": BUNDLED_MODEL_ID, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "Say hi"}]}).encode()
    try:
        # Nothing ready yet: the agent refuses before any engine (the gateway may ask another host).
        with pytest.raises(NotServedThere):
            await upstream.post(InferTarget(HOST, BUNDLED_MODEL_ID, CHAT), body, JSON)

        art = dict(model_id=BUNDLED_MODEL_ID, artifact_sha256=BUNDLED_SHA256, memory_mb=400)
        await js_log.append(make_command("load", "load", **art))
        await js_log.append(make_command("warm", "warm", dependencies=("load",), slots=2, context_size=1024, **art))
        assert (await wait_ack(js_log, "warm", timeout=60)).status == "succeeded"

        resp = await upstream.post(InferTarget(HOST, BUNDLED_MODEL_ID, CHAT), body, JSON)
        assert resp.status_code == 200
        assert json.loads(await resp.aread())["choices"][0]["message"]["content"].strip()
        await resp.aclose()
        assert agent.responder is not None and agent.responder.served == 1

        # A drain while 3 streams run through NATS: every stream finishes whole, and a request
        # that arrives after the drain began is refused by the agent, never started.
        long = json.dumps({"model": BUNDLED_MODEL_ID, "max_tokens": 48, "stream": True, "ignore_eos": True,
                           "messages": [{"role": "user", "content": "Count"}]}).encode()

        async def stream() -> bytes:
            r = await upstream.post(InferTarget(HOST, BUNDLED_MODEL_ID, CHAT), long,
                                    JSON + [(b"connection", b"close")])
            assert r.status_code == 200
            out = b"".join([c async for c in r.aiter_raw()])
            await r.aclose()
            return out

        streams = [asyncio.create_task(stream()) for _ in range(3)]
        await wait_for(lambda: _async(agent.responder.in_flight == 3), timeout=10, interval=0.02)
        await js_log.append(make_command("drain", "drain", **art))
        await wait_for(lambda: _async(agent.state.residencies[BUNDLED_MODEL_ID].state == "draining"),
                       timeout=10, interval=0.02)
        with pytest.raises(NotServedThere):
            await upstream.post(InferTarget(HOST, BUNDLED_MODEL_ID, CHAT), body, JSON)
        for answer in await asyncio.gather(*streams):
            # Whole: the engine stopped at max_tokens (not cut off) and the stream closed properly.
            # Chunks are not tokens (a multi-byte character may wait for the next token).
            assert answer.rstrip().endswith(b"data: [DONE]") and _finish_reasons(answer) == ["length"]
        drained = await wait_ack(js_log, "drain", timeout=270)
        assert drained.status == "succeeded", drained.message
        assert agent.responder.cancelled == 0
    finally:
        await gateway_log.close()
    await agent.stop()
    assert agent.responder is None


async def _async(value: bool) -> bool:
    return value


def _finish_reasons(answer: bytes) -> list[str]:
    reasons = []
    for line in answer.decode("utf-8", "replace").splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:]).get("choices", []):
                if choice.get("finish_reason"):
                    reasons.append(choice["finish_reason"])
    return reasons
