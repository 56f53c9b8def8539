"""Work in flight survives the drain boundaries: an unload after a drain that timed out, and a
graceful agent stop (what `gridctl node stop` and `gridctl down` do) while a request runs."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import psutil
import pytest

from grid.agent.artifacts import BUNDLED_MODEL_ID, BUNDLED_SHA256
from grid.transport.jetstream import JetStreamLog
from tests.integration.agent.agentkit import make_command, wait_ack, wait_for

pytestmark = pytest.mark.e2e

ART = dict(model_id=BUNDLED_MODEL_ID, artifact_sha256=BUNDLED_SHA256, memory_mb=400)
# Tokens of the request in flight: seconds of generation even on a fast machine (one thread:
# on a loaded machine two threads spin on each other and crawl).
TOKENS = 256


async def _warm(log: JetStreamLog, agent, tag: str) -> tuple[str, dict[str, str], psutil.Process]:
    await log.append(make_command(f"load-{tag}", "load", **ART))
    await log.append(make_command(f"warm-{tag}", "warm", dependencies=(f"load-{tag}",), context_size=2048, **ART))
    warm = await wait_ack(log, f"warm-{tag}", timeout=60)
    assert (warm.status, warm.message) == ("succeeded", "ready"), warm
    rec = agent.state.residencies[BUNDLED_MODEL_ID]
    key = agent.paths.engine_key.read_text().strip()
    return f"http://127.0.0.1:{rec.port}", {"Authorization": f"Bearer {key}"}, psutil.Process(rec.process.pid)


async def _start_long_request(client: httpx.AsyncClient, auth: dict[str, str], tokens: int) -> asyncio.Task:
    body = {"model": BUNDLED_MODEL_ID, "prompt": "Count slowly:", "n_predict": tokens, "ignore_eos": True}
    running = asyncio.create_task(client.post("/completion", json=body, headers=auth))

    async def processing() -> bool:
        slots = (await client.get("/slots", headers=auth)).json()
        return any(s["is_processing"] for s in slots)

    await wait_for(processing, timeout=15, interval=0.02)
    return running


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_unload_after_timed_out_drain_refuses_while_a_request_runs(js_log: JetStreamLog, start_agent):
    agent = await start_agent(drain_deadline=0.2, drain_poll=0.05, threads=1)
    endpoint, auth, child = await _warm(js_log, agent, "u")
    try:
        async with httpx.AsyncClient(base_url=endpoint, timeout=280, trust_env=False) as client:
            # Long enough to outlast the (short) drain deadline and the unload's boundary check.
            running = await _start_long_request(client, auth, tokens=TOKENS)
            await js_log.append(make_command("drain", "drain", **ART))
            drain = await wait_ack(js_log, "drain", timeout=30)
            assert drain.status == "failed" and drain.message.startswith("drain_deadline_exceeded"), drain
            await js_log.append(make_command("unload-1", "unload", **ART))
            unload = await wait_ack(js_log, "unload-1", timeout=30)
            assert unload.status == "failed" and unload.message == "requests_in_flight: 1", unload
            assert not running.done(), "the request finished too early to exercise the boundary"
            assert _alive(child)
            resp = await running
            assert resp.status_code == 200 and resp.json()["tokens_predicted"] == TOKENS
        # Idle now: the same unload goes through.
        await js_log.append(make_command("unload-2", "unload", **ART))
        unload = await wait_ack(js_log, "unload-2", timeout=60)
        assert (unload.status, unload.message) == ("succeeded", "unloaded")
        assert not _alive(child)
    finally:
        _kill(child)  # a failed run must not leave a busy engine behind (the short drain deadline would)


async def test_graceful_stop_waits_for_the_request_in_flight(js_log: JetStreamLog, start_agent):
    # A drain deadline well beyond the request: this test is about waiting, not giving up.
    agent = await start_agent(drain_deadline=240.0, threads=1)
    endpoint, auth, child = await _warm(js_log, agent, "s")
    try:
        async with httpx.AsyncClient(base_url=endpoint, timeout=280, trust_env=False) as client:
            running = await _start_long_request(client, auth, tokens=TOKENS)
            assert not running.done()
            await agent.stop(drain=True)
            # The child was stopped only after it went idle: the request came back whole.
            resp = await running
            assert resp.status_code == 200 and resp.json()["tokens_predicted"] == TOKENS
        assert not _alive(child)
        assert agent.state.residencies[BUNDLED_MODEL_ID].state == "cached"
    finally:
        _kill(child)


def _kill(proc: psutil.Process) -> None:
    if _alive(proc):
        proc.kill()


async def test_a_drain_rides_out_an_engine_too_busy_to_answer_its_activity_probe(js_log: JetStreamLog, start_agent):
    """An engine that misses a few /slots readings (stopped for 6 s here: as slow as a busy engine
    on a loaded machine gets) is still drained: activity is unknown only after
    ACTIVITY_UNKNOWN_SECONDS without a reading, never taken as idle meanwhile. Three missed 1 s
    probes used to fail the drain at once."""
    agent = await start_agent(drain_poll=0.1)
    _endpoint, _auth, child = await _warm(js_log, agent, "p")
    try:
        child.suspend()
        await js_log.append(make_command("drain", "drain", **ART))
        await wait_for(lambda: _state_is(agent, "draining"), timeout=10, interval=0.05)
        await asyncio.sleep(6.0)
        child.resume()
        drain = await wait_ack(js_log, "drain", timeout=30)
        assert (drain.status, drain.message) == ("succeeded", "drained"), drain
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.resume()
        _kill(child)


async def _state_is(agent, state: str) -> bool:
    return agent.state.residencies[BUNDLED_MODEL_ID].state == state
