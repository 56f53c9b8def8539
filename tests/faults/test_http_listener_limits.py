"""Every HTTP listener Grid runs bounds header time, idle keep-alive and open connections
(grid.http_limits), on real uvicorn servers started the way Grid starts them, over real sockets.

Incident (issue 25): a request line followed by one byte every 5 s stayed open over 180 s;
200 idle connections were never closed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from grid.agent.http import AgentHttp
from grid.config import GridConfig
from grid.events.log import InMemoryLog
from grid.gateway.app import create_gateway_app, start_gateway
from grid.gateway.settings import GatewaySettings
from grid.http_limits import HEADER_SECONDS_ENV, KEEPALIVE_SECONDS_ENV, MAX_CONNECTIONS_ENV, ListenerLimits
from grid.metrics import AgentMetrics
from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import JetStreamLog

from tests.conftest import reset_streams

HEADER = 1.0
KEEPALIVE = 0.5
MAX_CONNECTIONS = 6
LIMITS = ListenerLimits(header_seconds=HEADER, keep_alive_seconds=KEEPALIVE, max_connections=MAX_CONNECTIONS)


@dataclass
class Listener:
    host: str
    port: int
    path: str  # a GET that answers 200

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@pytest.fixture(params=["gateway", "admin", "dashboard", "agent"])
async def listener(request: pytest.FixtureRequest, tmp_path: Path, nats_server: EmbeddedNats,
                   monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Listener]:
    kind = request.param
    if kind == "gateway":
        app = create_gateway_app(InMemoryLog(), GridConfig(home=tmp_path, nats_url=None), api_keys=[],
                                 settings=GatewaySettings(listener=LIMITS))
        gw = await start_gateway(app, "127.0.0.1", 0, write_url_file=False)
        yield Listener(gw.host, gw.port, "/v1/models")
        await gw.stop()
    elif kind == "admin":
        from grid.controller.api import serve_admin
        from grid.controller.service import Controller

        from tests.integration.controller.test_cli_admin import SETTINGS

        js_log = await JetStreamLog.connect(nats_server.url)
        await reset_streams(js_log)
        ctl = Controller(js_log, tmp_path / "home", settings=SETTINGS, controller_id="ctl-limits")
        await ctl.start()
        admin = await serve_admin(ctl, "127.0.0.1", 0, limits=LIMITS)
        port = int((admin.url or "").rsplit(":", 1)[1])
        yield Listener("127.0.0.1", port, "/openapi.json")
        await admin.stop()
        await ctl.stop()
        await js_log.close()
    elif kind == "dashboard":  # the real dashboard, its limits from the environment (GRID_HTTP_*)
        from grid.dashboard.serve import start_dashboard

        monkeypatch.setenv(HEADER_SECONDS_ENV, str(HEADER))
        monkeypatch.setenv(KEEPALIVE_SECONDS_ENV, str(KEEPALIVE))
        monkeypatch.setenv(MAX_CONNECTIONS_ENV, str(MAX_CONNECTIONS))
        dashboard = await start_dashboard(InMemoryLog(), "127.0.0.1", 0)
        yield Listener("127.0.0.1", dashboard.server.port, "/")
        await dashboard.stop()
    else:
        http = AgentHttp(AgentMetrics([]), tmp_path, LIMITS)
        url = await http.start(0)
        yield Listener("127.0.0.1", int(url.rsplit(":", 1)[1]), "/health")
        await http.stop()


async def closed_within(reader: asyncio.StreamReader, timeout: float) -> bytes:
    """Everything the server sends until it closes the connection (raises TimeoutError if it does not)."""
    data = b""
    async with asyncio.timeout(timeout):
        while chunk := await reader.read(65536):
            data += chunk
    return data


async def test_a_slow_header_trickle_is_answered_408_and_closed(listener: Listener) -> None:
    reader, writer = await asyncio.open_connection(listener.host, listener.port)
    writer.write(b"GET " + listener.path.encode() + b" HTTP/1.1\r\nhost: x\r\n")
    started = time.monotonic()

    async def trickle() -> None:
        for _ in range(100):
            await asyncio.sleep(0.2)
            writer.write(b"x")  # a header name that never ends

    dripping = asyncio.create_task(trickle())
    try:
        data = await closed_within(reader, HEADER + 2.0)
    finally:
        dripping.cancel()
        writer.close()
    assert time.monotonic() - started < HEADER + 1.5
    assert data.startswith(b"HTTP/1.1 408 "), data


async def test_silent_and_idle_keep_alive_connections_are_closed(listener: Listener) -> None:
    # Connections that never send a byte are closed at the header bound.
    silent = [await asyncio.open_connection(listener.host, listener.port) for _ in range(3)]
    # A keep-alive connection idle after its response is closed at the keep-alive bound.
    reader, writer = await asyncio.open_connection(listener.host, listener.port)
    writer.write(b"GET " + listener.path.encode() + b" HTTP/1.1\r\nhost: x\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
    assert head.startswith(b"HTTP/1.1 200 "), head
    answered = time.monotonic()
    await closed_within(reader, KEEPALIVE + 2.0)
    assert KEEPALIVE * 0.8 <= time.monotonic() - answered < KEEPALIVE + 1.0
    for r, w in silent:
        assert await closed_within(r, HEADER + 2.0) == b""
        w.close()
    writer.close()


async def test_connections_beyond_the_limit_are_refused_and_idle_ones_give_way(listener: Listener) -> None:
    async with httpx.AsyncClient(base_url=listener.url, timeout=5.0) as client:
        # Idle connections filling the limit give way to a new request.
        idle = [await asyncio.open_connection(listener.host, listener.port) for _ in range(MAX_CONNECTIONS)]
        await asyncio.sleep(0.1)
        assert (await client.get(listener.path)).status_code == 200
        for _r, w in idle:
            w.close()
        await client.aclose()

    # Busy connections (heads arriving) filling the limit: one more is answered 503 and closed.
    busy = []
    for _ in range(MAX_CONNECTIONS):
        r, w = await asyncio.open_connection(listener.host, listener.port)
        w.write(b"GET " + listener.path.encode() + b" HTTP/1.1\r\nhost: x\r\n")
        busy.append((r, w))
    await asyncio.sleep(0.1)
    reader, writer = await asyncio.open_connection(listener.host, listener.port)
    writer.write(b"GET " + listener.path.encode() + b" HTTP/1.1\r\nhost: x\r\n\r\n")
    data = await closed_within(reader, 3.0)
    assert data.startswith(b"HTTP/1.1 503 "), data
    writer.close()
    for _r, w in busy:
        w.close()
    await asyncio.sleep(0.1)
    # Once they are gone, requests are served again.
    async with httpx.AsyncClient(base_url=listener.url, timeout=5.0) as client:
        assert (await client.get(listener.path)).status_code == 200
