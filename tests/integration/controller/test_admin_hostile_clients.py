"""Issue 17's admin leftovers: half-sent bodies are bounded in time and number, and no forwarding
header is trusted unless configured. Real sockets against the real admin server."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from grid.controller.api import serve_admin
from grid.controller.service import Controller
from grid.transport.jetstream import JetStreamLog

from tests.integration.controller.test_cli_admin import SETTINGS


async def _half_request(port: int, token: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"PUT /allocator/models/half.gguf HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"X-Grid-Allocator-Token: " + token.encode() + b"\r\nContent-Length: 200\r\n\r\n{\"memory_mb\": ")
    await writer.drain()
    return reader, writer


async def _status_line(reader: asyncio.StreamReader, timeout: float) -> bytes:
    return await asyncio.wait_for(reader.readline(), timeout)


async def test_half_sent_bodies_time_out_and_are_bounded_in_number(js_log: JetStreamLog, tmp_path: Path) -> None:
    ctl = Controller(js_log, tmp_path / "home", settings=SETTINGS, controller_id="ctl-hostile")
    await ctl.start()
    admin = await serve_admin(ctl, "127.0.0.1", 0, body_timeout_seconds=1.0, max_incomplete_bodies=4)
    port = int((admin.url or "").rsplit(":", 1)[1])
    token = ctl.token or ""
    conns = []
    try:
        t0 = time.monotonic()
        for _ in range(4):
            conns.append(await _half_request(port, token))
        await asyncio.sleep(0.2)
        # The fifth incomplete body is refused at once, not held.
        reader, writer = await _half_request(port, token)
        conns.append((reader, writer))
        assert b" 503 " in await _status_line(reader, 0.8)
        # A complete request still goes through meanwhile.
        async with httpx.AsyncClient(base_url=admin.url, timeout=5) as client:
            ok = await client.put("/allocator/models/whole.gguf", json={"memory_mb": 10},
                                  headers={"X-Grid-Allocator-Token": token})
            assert ok.status_code == 200
        # The four held ones time out with 408 after about a second and are closed.
        for reader, _writer in conns[:4]:
            line = await _status_line(reader, 5.0)
            assert b" 408 " in line, line
            rest = await asyncio.wait_for(reader.read(), 5.0)  # server closes the connection
            assert b"request_body_timeout" in rest
        assert time.monotonic() - t0 < 4.0
        assert "half.gguf" not in ctl.runner["catalog"].profiles
    finally:
        for _reader, writer in conns:
            writer.close()
        await admin.stop()
        await ctl.stop()


async def test_forwarded_for_is_ignored_unless_a_proxy_is_configured(js_log: JetStreamLog, tmp_path: Path) -> None:
    ctl = Controller(js_log, tmp_path / "home", settings=SETTINGS, controller_id="ctl-xff")
    await ctl.start()
    try:
        # Status is open on loopback and needs the token elsewhere: the address it sees decides.
        admin = await serve_admin(ctl, "127.0.0.1", 0)
        try:
            async with httpx.AsyncClient(base_url=admin.url, timeout=5) as client:
                resp = await client.get("/allocator/status", headers={"X-Forwarded-For": "203.0.113.9"})
                assert resp.status_code == 200  # the header did not change who the client is
        finally:
            await admin.stop()
        admin = await serve_admin(ctl, "127.0.0.1", 0, trusted_proxies=("127.0.0.1",))
        try:
            async with httpx.AsyncClient(base_url=admin.url, timeout=5) as client:
                resp = await client.get("/allocator/status", headers={"X-Forwarded-For": "203.0.113.9"})
                assert resp.status_code == 401  # configured: the proxy's word is taken
                # Seen as remote, /metrics needs the operator token too; with it, it answers.
                remote = {"X-Forwarded-For": "203.0.113.9"}
                assert (await client.get("/metrics", headers=remote)).status_code == 401
                ok = await client.get("/metrics", headers={**remote, "Authorization": f"Bearer {ctl.token}"})
                assert ok.status_code == 200 and "grid_controller_lease_term" in ok.text
        finally:
            await admin.stop()
    finally:
        await ctl.stop()
