"""LOAD -> WARM -> READY -> real completion -> DRAIN while a request runs -> UNLOAD."""

from __future__ import annotations

import asyncio
import time

import httpx
import psutil
import pytest

from grid.agent.artifacts import BUNDLED_MODEL_ID, BUNDLED_SHA256
from grid.agent.engines.llama_cpp import port_free
from grid.transport.jetstream import JetStreamLog
from tests.integration.agent.agentkit import heartbeats, make_command, wait_ack, wait_for

pytestmark = pytest.mark.e2e


async def _residency(log: JetStreamLog, state: str):
    hbs = await heartbeats(log)
    if not hbs:
        return None
    for r in hbs[-1].residencies:
        if r.model_id == BUNDLED_MODEL_ID and r.state == state:
            return r
    return None


# Generous: CI shares 2 cores between two test workers, and a generating engine crawls then.
DRAIN_DEADLINE = 240.0


async def test_warm_serve_drain_unload(js_log: JetStreamLog, start_agent):
    # The drain waits for the request in flight: give it as long as a loaded CI machine needs.
    agent = await start_agent(drain_deadline=DRAIN_DEADLINE)
    art = dict(model_id=BUNDLED_MODEL_ID, artifact_sha256=BUNDLED_SHA256, memory_mb=400)
    await js_log.append(make_command("load", "load", **art))
    await js_log.append(make_command("warm", "warm", dependencies=("load",), slots=2, context_size=1024, **art))
    load, warm = await wait_ack(js_log, "load"), await wait_ack(js_log, "warm", timeout=60)
    assert (load.status, load.artifact_fetched) == ("succeeded", False)
    assert (warm.status, warm.message) == ("succeeded", "ready"), warm
    assert warm.duration_seconds is not None and 0 < warm.duration_seconds < 30

    ready = await wait_for(lambda: _residency(js_log, "ready"))
    assert ready.endpoint and ready.endpoint.startswith("http://127.0.0.1:")
    assert ready.max_concurrency == 2 and ready.artifact_sha256 == BUNDLED_SHA256
    rec = agent.state.residencies[BUNDLED_MODEL_ID]
    child = psutil.Process(rec.process.pid)
    key = agent.paths.engine_key.read_text().strip()
    # The key is only in the 0600 key file: not in argv, not in the child's environment.
    assert all(key not in arg for arg in child.cmdline())
    assert key not in "".join(f"{k}={v}" for k, v in child.environ().items())
    assert "--api-key-file" in child.cmdline() and "--slots" in child.cmdline()

    body = {"model": BUNDLED_MODEL_ID, "messages": [{"role": "user", "content": "Reply with OK"}], "max_tokens": 8}
    auth = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=ready.endpoint, timeout=120, trust_env=False) as client:
        ok = await client.post("/v1/chat/completions", json=body, headers=auth)
        assert ok.status_code == 200
        assert ok.json()["choices"][0]["message"]["content"].strip()
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 401
        assert (await client.get("/slots")).status_code == 401

        # A long request is running when the drain arrives: it must finish before the drain acks.
        long_body = {"model": BUNDLED_MODEL_ID, "prompt": "Count slowly:", "n_predict": 96, "ignore_eos": True}
        finished_at: list[float] = []

        async def long_request() -> httpx.Response:
            resp = await client.post("/completion", json=long_body, headers=auth)
            finished_at.append(time.monotonic())
            return resp

        running = asyncio.create_task(long_request())
        await wait_for(lambda: _active(client, auth), timeout=10, interval=0.05)
        await js_log.append(make_command("drain", "drain", **art))
        draining = await wait_for(lambda: _residency(js_log, "draining"), timeout=5, interval=0.05)
        assert draining.endpoint is not None  # still finishing work, but out of routing
        assert not running.done(), "the drain heartbeat must go out while the request still runs"
        drain = await wait_ack(js_log, "drain", timeout=DRAIN_DEADLINE + 30)
        acked_at = time.monotonic()
        resp = await running
        assert resp.status_code == 200 and resp.json()["tokens_predicted"] == 96
        assert (drain.status, drain.message) == ("succeeded", "drained"), drain
        assert finished_at[0] <= acked_at

    await js_log.append(make_command("unload", "unload", **art))
    unload = await wait_ack(js_log, "unload", timeout=60)
    assert (unload.status, unload.message) == ("succeeded", "unloaded")
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    assert port_free(int(ready.endpoint.rsplit(":", 1)[1]))
    cached = await wait_for(lambda: _residency(js_log, "cached"))
    assert cached.memory_mb == 0 and cached.endpoint is None
    hb = (await heartbeats(js_log))[-1]
    assert [c.sha256 for c in hb.cached] == [BUNDLED_SHA256]
    assert hb.resources.runtimes == ("llama.cpp",) and hb.resources.backends == ("cpu",)
    assert hb.disk_free_bytes and hb.disk_total_bytes


async def _active(client: httpx.AsyncClient, auth: dict[str, str]) -> bool:
    slots = (await client.get("/slots", headers=auth)).json()
    return any(s["is_processing"] for s in slots)
