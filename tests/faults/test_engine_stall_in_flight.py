"""An engine that stops mid-answer ends the answers waiting on it on evidence, within seconds; a
busy engine that still answers is never cut off.

Before, an agent forwarded a request to its engine with a 600 s read timeout and, while the engine
sent nothing, told the gateway once a second that it was still working: an engine stopped with
SIGSTOP (or wedged, or deadlocked) held the request for up to ten minutes. Now, once an engine has
sent nothing for a couple of seconds, its agent checks it (GET /health, which llama-server answers
from its HTTP threads even while its slots are busy) once per interval, one check shared by every
answer waiting on it; after STALL_PROBES unanswered checks in a row the answers end with a
retryable `engine_stalled` error (504, or an error event ending a stream), the agent refuses new
requests for that engine until a check is answered again, and the gateway then asks another
replica or answers 503 at once.

Real parts: nats-server, two llama.cpp engines (xllamacpp) with the SmolLM2 GGUF, the agent's
responder with its own engine client, and the gateway's app over NATS. One engine is stopped with
SIGSTOP while a stream and a non-streamed answer are generated on it; the other generates a long
non-streamed answer meanwhile (silent for longer than a stalled engine is given) and must not be
cut off. Both engines are killed at the end, whatever happened (SIGCONT first).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from starlette.applications import Starlette

from grid.agent.engine_client import H1EngineClient
from grid.agent.engines.llama_cpp import EngineSpec, probe_active, spawn
from grid.agent.engines.runtime import Runtime
from grid.gateway.routes import build_routes, exception_handlers
from grid.gateway.upstream import Upstream
from grid.infer.responder import (
    PROBE_INTERVAL_SECONDS,
    PROBE_TIMEOUT_SECONDS,
    STALL_BOUND_SECONDS,
    STALL_PROBES,
    EngineRoute,
    InferenceResponder,
)
from grid.transport.embedded import EmbeddedNats, free_port

from tests.unit.gateway.test_placed_routing import Fleet, fleet, ready  # noqa: F401 - the fixture

pytestmark = [pytest.mark.engine, pytest.mark.slow]

HOST = "h1"
STOPPED, BUSY = "m", "busy"
CHAT = "/v1/chat/completions"
# Scheduling room on a loaded 2-core machine beyond the responder's own bound (a sweep or a
# check a little late, the gateway's hop, the test's polling).
LATE_SECONDS = 5.0
# What the grid promises a request in flight on an engine that stopped.
PROMISED_SECONDS = 15.0
# Long enough that neither engine finishes before the test is done with it (~20-40 tokens/s here).
LONG_TOKENS = 1500


def _healthy(endpoint: str) -> bool:
    try:
        return httpx.get(endpoint + "/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


Engines = dict[str, tuple[EngineRoute, subprocess.Popen[bytes]]]


@pytest.fixture(scope="module")
def engines(engine_runtime: Runtime, bundled_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    """Two engines started side by side, one thread each (two cores): two slots for the one to be
    stopped (a stream and a non-streamed answer), one for the busy one."""
    home = tmp_path_factory.mktemp("stall-engines")
    key = secrets.token_urlsafe(24)
    key_file = home / "engine.key"
    key_file.write_text(key)
    key_file.chmod(0o600)
    started: Engines = {}
    try:
        for model, slots in ((STOPPED, 2), (BUSY, 1)):
            spec = EngineSpec(model_id=model, model_path=bundled_gguf, port=free_port(), key_file=key_file,
                              slots=slots, context_size=2048, threads=1)
            proc = spawn(engine_runtime.command, spec, home / f"{model}.log")
            started[model] = (EngineRoute(spec.endpoint, key), proc)
        deadline = time.monotonic() + 120
        for model, (route, proc) in started.items():
            while not _healthy(route.endpoint):
                assert proc.poll() is None and time.monotonic() < deadline, (home / f"{model}.log").read_text()[-2000:]
                time.sleep(0.1)
        yield started
    finally:
        for _route, proc in started.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)  # a stopped process would keep a SIGTERM pending
            proc.kill()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass


@dataclass(frozen=True)
class Check:
    """One health check the responder made (its own real GET), as the test saw it."""

    endpoint: str
    started: float
    ended: float
    answered: bool


@dataclass
class Grid:
    http: httpx.AsyncClient
    responder: InferenceResponder
    checks: list[Check]

    def of(self, endpoint: str) -> list[Check]:
        return [c for c in self.checks if c.endpoint == endpoint]


@pytest.fixture
async def grid(engines: Engines, nats_server: EmbeddedNats, fleet: Fleet) -> AsyncIterator[Grid]:  # noqa: F811
    """The gateway's app routing both models to one host, whose agent's responder forwards them
    to the two engines over NATS (separate connections, as on two machines). Its health checks
    are its own, recorded on their way."""
    agent_nc = await nats.connect(nats_server.url, name="agent-h1")
    gateway_nc = await nats.connect(nats_server.url, name="gateway")
    routes = {model: route for model, (route, _proc) in engines.items()}
    checks: list[Check] = []

    async def recorded(route: EngineRoute) -> bool:
        started = time.monotonic()
        answered = await responder.check_engine(route)
        checks.append(Check(route.endpoint, started, time.monotonic(), answered))
        return answered

    responder = InferenceResponder(agent_nc, HOST, routes.get, engine_client=H1EngineClient(), probe=recorded)
    await responder.start()
    app = Starlette(routes=build_routes(), exception_handlers=exception_handlers())
    app.state.gateway = fleet.gw
    try:
        claims = [ready(STOPPED, managed=False, sha=None, port=1), ready(BUSY, managed=False, sha=None, port=2)]
        await fleet.placements.admit(HOST, claims)  # the operator admitted both external engines
        await fleet.heartbeat(HOST, *claims)
        fleet.gw.upstream = Upstream(backend="nats", nc=gateway_nc, read_timeout=120.0)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=120) as http:
            yield Grid(http, responder, checks)
    finally:
        await responder.stop()
        if fleet.gw.upstream is not None:
            await fleet.gw.upstream.aclose()
        await agent_nc.close()
        await gateway_nc.close()


def _chat(model: str, stream: bool, max_tokens: int = LONG_TOKENS) -> dict[str, Any]:
    return {"model": model, "stream": stream, "max_tokens": max_tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Count from one to one thousand."}]}


async def _timed(http: httpx.AsyncClient, body: dict[str, Any]) -> tuple[httpx.Response, float]:
    response = await http.post(CHAT, json=body)
    return response, time.monotonic()


def _events(body: str) -> list[str]:
    return [line[len("data: "):] for line in body.splitlines() if line.startswith("data: ")]


def _one_per_interval(checks: list[Check]) -> bool:
    """At most one check of an engine per interval, however many answers wait on it (the
    scheduling of one loop: a few ms of slack)."""
    return all(b.started - a.started >= PROBE_INTERVAL_SECONDS - 0.05 for a, b in zip(checks, checks[1:]))


async def test_a_stopped_engine_ends_its_answers_within_seconds_and_a_busy_one_is_never_cut_off(
        grid: Grid, engines: Engines) -> None:
    http, responder = grid.http, grid.responder
    stopped_route, stopped_proc = engines[STOPPED]
    busy_route = engines[BUSY][0]
    streamed = asyncio.create_task(_timed(http, _chat(STOPPED, True)))
    plain = asyncio.create_task(_timed(http, _chat(STOPPED, False)))
    busy_started = time.monotonic()
    busy = asyncio.create_task(_timed(http, _chat(BUSY, False)))
    try:
        # Both answers on the engine to be stopped are being generated, the stream has tokens out.
        async with httpx.AsyncClient() as probe:
            deadline = time.monotonic() + 30
            while await probe_active(probe, stopped_route.endpoint, stopped_route.key) != 2 or responder.in_flight < 3:
                assert time.monotonic() < deadline, "the answers never started"
                assert not (streamed.done() or plain.done() or busy.done()), "an answer ended before the stop"
                await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        os.kill(stopped_proc.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()

        # 1. Both answers on the stopped engine end with the retryable error, within the bound.
        async with asyncio.timeout(STALL_BOUND_SECONDS + LATE_SECONDS + 10):
            (plain_answer, plain_end), (stream_answer, stream_end) = await asyncio.gather(plain, streamed)
        stopped_checks = grid.of(stopped_route.endpoint)
        figures = {"plain": round(plain_end - stopped_at, 2), "streamed": round(stream_end - stopped_at, 2),
                   "bound": STALL_BOUND_SECONDS,
                   "checks_of_stopped": [(round(c.started - stopped_at, 2), c.answered) for c in stopped_checks]}
        print(f"\nended after the stop: {figures}")
        assert plain_answer.status_code == 504, plain_answer.text
        assert plain_answer.json()["error"]["code"] == "engine_stalled"
        assert plain_answer.json()["error"]["type"] == "server_error" and plain_answer.headers["retry-after"] == "1"
        assert stream_answer.status_code == 200
        events = _events(stream_answer.text)
        assert len(events) > 2 and "[DONE]" not in events, events[-3:]
        assert json.loads(events[0])["choices"], "the stream had tokens before the stop"
        assert json.loads(events[-1])["error"]["code"] == "engine_stalled", events[-1]
        for ended in (plain_end, stream_end):
            assert ended - stopped_at <= min(STALL_BOUND_SECONDS + LATE_SECONDS, PROMISED_SECONDS), figures
        assert responder.stalled_answers == 2
        # Judged on STALL_PROBES unanswered checks after the stop, one per interval for the
        # engine, shared by both answers (not STALL_PROBES per answer); any check of it that
        # ended before the stop was answered.
        judged = [c for c in stopped_checks if stopped_at <= c.ended <= min(plain_end, stream_end)]
        assert [c.answered for c in judged] == [False] * STALL_PROBES, figures
        assert all(c.answered for c in stopped_checks if c.ended < stopped_at), figures
        assert _one_per_interval(stopped_checks), figures

        # 2. While it stays stopped, a new request is not sent to it: the agent refuses it before
        # the engine sees it, and with no other replica the gateway answers 503 at once.
        deadline = time.monotonic() + 10
        while True:
            asked = time.monotonic()
            again = await http.post(CHAT, json=_chat(STOPPED, False, max_tokens=4))
            assert time.monotonic() - asked < PROBE_TIMEOUT_SECONDS, "a new request waited on the stopped engine"
            # Retryable, never an engine error: the route is failing (the gateway's breaker, open
            # after the two failures, may answer before the agent is asked) or refused by its agent.
            assert again.status_code == 503 and "retry-after" in again.headers, again.text
            assert again.json()["error"]["code"] in ("upstream_unavailable", "model_not_ready"), again.text
            if responder.refused_stalled:
                break
            assert time.monotonic() < deadline, again.text
            await asyncio.sleep(0.3)

        # 3. The busy engine's answer has been silent longer than a stopped engine is given, its
        # checks were answered, and it is still being generated (or was answered in full).
        deadline = time.monotonic() + 20
        while (time.monotonic() - busy_started < STALL_BOUND_SECONDS + LATE_SECONDS
               or len(grid.of(busy_route.endpoint)) < STALL_PROBES + 1) and not busy.done():
            assert time.monotonic() < deadline, grid.of(busy_route.endpoint)
            await asyncio.sleep(0.1)
        if busy.done():
            busy_answer, busy_end = busy.result()
            assert busy_answer.status_code == 200, busy_answer.text  # answered in full, not cut off
            assert busy_end - busy_started > STALL_BOUND_SECONDS + LATE_SECONDS, \
                f"the busy answer took {busy_end - busy_started:.1f}s, too short to prove anything: make it longer"
        busy_checks = grid.of(busy_route.endpoint)
        print(f"checks of the busy engine: {[(round(c.started - busy_started, 2), c.answered) for c in busy_checks]}")
        assert len(busy_checks) >= STALL_PROBES + 1 and all(c.answered for c in busy_checks)
        assert _one_per_interval(busy_checks)
        assert responder.stalled_answers == 2

        # 4. Resumed, the engine answers its next check and serves again.
        os.kill(stopped_proc.pid, signal.SIGCONT)
        resumed_at = time.monotonic()
        deadline = resumed_at + PROBE_INTERVAL_SECONDS + PROBE_TIMEOUT_SECONDS + LATE_SECONDS + 5
        while True:
            answer = await http.post(CHAT, json=_chat(STOPPED, False, max_tokens=4))
            if answer.status_code == 200:
                break
            assert answer.status_code == 503 and time.monotonic() < deadline, answer.text
            await asyncio.sleep(0.3)
        print(f"served again {time.monotonic() - resumed_at:.2f}s after SIGCONT")
    finally:
        busy.cancel()
        for task in (streamed, plain, busy):
            with contextlib.suppress(BaseException):
                await task
