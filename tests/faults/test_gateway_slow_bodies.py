"""Half-sent request bodies cannot hold the gateway: each has a deadline, and only a bounded
number may be arriving at once; complete requests are never held back by them.

Incident: clients that sent headers and part of a body, then stopped, kept 300 requests open on
the gateway for at least 12 s (no read timeout, no bound).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from grid.config import GridConfig
from grid.events.log import InMemoryLog
from grid.gateway.app import RunningGateway, create_gateway_app, start_gateway
from grid.gateway.settings import GatewaySettings

BODY_TIMEOUT = 1.0
MAX_INCOMPLETE = 4


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[RunningGateway]:
    settings = GatewaySettings(body_timeout_seconds=BODY_TIMEOUT, max_incomplete_bodies=MAX_INCOMPLETE)
    app = create_gateway_app(InMemoryLog(), GridConfig(home=tmp_path, nats_url=None), api_keys=[], settings=settings)
    running = await start_gateway(app, "127.0.0.1", 0, write_url_file=False)
    yield running
    await running.stop()


async def half_sent(running: RunningGateway) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A chat request whose headers promise 200 body bytes, of which 20 are sent."""
    reader, writer = await asyncio.open_connection(running.host, running.port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
                 b"content-length: 200\r\n\r\n" + b'{"model":"m","messag')
    await writer.drain()
    return reader, writer


async def answer(reader: asyncio.StreamReader, timeout: float) -> tuple[int, dict, bool]:
    """(status, JSON body, whether the gateway closed the connection after it)."""
    raw = await asyncio.wait_for(reader.read(65536), timeout)
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    closed = await asyncio.wait_for(reader.read(1), timeout) == b""
    return status, json.loads(body), closed


async def incomplete(http: httpx.AsyncClient) -> int:
    return int((await http.get("/gateway/stats")).json()["intake"]["incomplete"])


async def test_half_sent_bodies_are_bounded_in_number_and_time(gateway: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=5.0) as http:
        held = [await half_sent(gateway) for _ in range(MAX_INCOMPLETE)]
        started = time.monotonic()
        for _ in range(100):
            if await incomplete(http) == MAX_INCOMPLETE:
                break
            await asyncio.sleep(0.01)
        assert await incomplete(http) == MAX_INCOMPLETE

        # One more half-sent body is refused at once, and its connection closed.
        reader, writer = await half_sent(gateway)
        status, body, closed = await answer(reader, 0.5)
        assert (status, body["error"]["code"], closed) == (503, "too_many_incomplete_requests", True)
        writer.close()

        # A complete request is not held back by the pending ones.
        r = await http.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"

        # Each pending body gets a 408 at its deadline, and the connection is closed.
        for reader, writer in held:
            status, body, closed = await answer(reader, BODY_TIMEOUT + 2.0)
            assert (status, body["error"]["code"], closed) == (408, "request_body_timeout", True)
            assert body["error"]["type"] == "invalid_request_error"
            writer.close()
        assert time.monotonic() - started < BODY_TIMEOUT + 2.0
        assert await incomplete(http) == 0
        intake = (await http.get("/gateway/stats")).json()["intake"]
        assert (intake["refused"], intake["timed_out"]) == (1, MAX_INCOMPLETE)


async def test_a_slow_but_steady_body_within_the_deadline_is_read_whole(gateway: RunningGateway) -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 400}]}).encode()

    async def trickle() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 100):
            yield body[i:i + 100]
            await asyncio.sleep(0.05)

    async with httpx.AsyncClient(base_url=gateway.url, timeout=5.0) as http:
        r = await http.post("/v1/chat/completions", content=trickle(), headers={"content-type": "application/json"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"  # parsed whole
