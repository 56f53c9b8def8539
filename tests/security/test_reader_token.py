"""The reader token: it opens the dashboard (page, view, live stream) and the admin API's reads,
and every mutation of the admin API refuses it (403) without appending anything.

Real parts: nats-server with JetStream, the controller with its admin API over HTTP, the
dashboard following the log, and `gridctl dashboard token` as a child process.
"""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from pathlib import Path

import httpx
import pytest

from grid.controller.api import serve_admin
from grid.controller.service import Controller, ControllerSettings
from grid.dashboard.app import Dashboard, create_dashboard_app, require_token_off_loopback
from grid.events.subjects import CONTROL_STREAM
from grid.serving import serve
from grid.transport.jetstream import JetStreamLog

SETTINGS = ControllerSettings(tick_interval_seconds=0.5, coalesce_seconds=0.02, lease_ttl_seconds=3.0,
                              lease_renew_seconds=0.5, restart_grace_seconds=0.0, analytics=True)


async def _gridctl(home: Path, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "GRID_HOME": str(home)}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "grid.cli.main", *args, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


async def _last_seq(log: JetStreamLog) -> int:
    return max([m.seq async for m in log.replay(CONTROL_STREAM)], default=0)


async def test_reader_token_reads_admin_api_but_cannot_mutate(js_log: JetStreamLog, tmp_path: Path) -> None:
    home = tmp_path / "home"
    ctl = Controller(js_log, home, settings=SETTINGS, controller_id="ctl-reader")
    await ctl.start()
    admin = await serve_admin(ctl, "127.0.0.1", 0)
    try:
        rc, reader, err = await _gridctl(home, "dashboard", "token")
        assert rc == 0, err
        reader = reader.strip()
        path = home / "reader.token"
        assert path.read_text().strip() == reader and stat.S_IMODE(path.stat().st_mode) == 0o600
        assert reader != ctl.token
        as_reader = {"Authorization": f"Bearer {reader}"}
        as_operator = {"X-Grid-Allocator-Token": ctl.token or ""}
        async with httpx.AsyncClient(base_url=admin.url, timeout=10) as client:
            # Reads: the reader token is enough; no token is not.
            assert (await client.get("/allocator/history/demand", headers=as_reader)).status_code == 200
            assert (await client.get("/allocator/history/demand",
                                     headers={"X-Grid-Allocator-Token": reader})).status_code == 200
            assert (await client.get("/allocator/history/demand")).status_code == 401
            assert (await client.get("/allocator/history/demand",
                                     headers={"Authorization": "Bearer " + reader[:-1]})).status_code == 401
            # Mutations: every one refuses the reader token, and nothing reaches the log.
            before = await _last_seq(js_log)
            attempts = [
                ("PUT", "/allocator/models/evil.gguf", {"memory_mb": 100}),
                ("PATCH", "/allocator/models/evil.gguf", {"memory_mb": 200}),
                ("DELETE", "/allocator/models/evil.gguf", None),
                ("PUT", "/allocator/mode", {"mode": "observe"}),
                ("POST", "/allocator/tick", {"reason": "reader"}),
                ("PUT", "/allocator/forecast-window", {"bucket_seconds": 4}),
                ("POST", "/allocator/evaluations", {"model_id": "evil.gguf", "workload": "coding", "passed": 1, "total": 1}),
            ]
            for method, url, body in attempts:
                resp = await client.request(method, url, json=body, headers=as_reader)
                assert resp.status_code == 403, (method, url, resp.text)
                assert resp.json()["error"] == "forbidden"
            assert await _last_seq(js_log) == before
            assert "evil.gguf" not in ctl.runner["catalog"].profiles
            # The operator token still may.
            ok = await client.put("/allocator/models/ok.gguf", json={"memory_mb": 100}, headers=as_operator)
            assert ok.status_code == 200, ok.text
    finally:
        await admin.stop()
        await ctl.stop()


async def test_reader_token_opens_the_dashboard_and_its_stream(js_log: JetStreamLog) -> None:
    dash = Dashboard(js_log)
    await dash.start()
    app = create_dashboard_app(dash, token="operator-secret", reader_token="reader-secret")
    server = await serve(app, "127.0.0.1", 0, name="dashboard-reader")
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
            assert (await client.get("/api/view")).status_code == 401
            assert (await client.get("/api/stream")).status_code == 401
            assert (await client.get("/?token=reader-secreT")).status_code == 401
            for secret in ("reader-secret", "operator-secret"):
                bearer = {"Authorization": f"Bearer {secret}"}
                assert (await client.get("/api/view", headers=bearer)).status_code == 200
                async with client.stream("GET", "/api/stream", headers=bearer) as resp:
                    assert resp.status_code == 200
                    first = await asyncio.wait_for(anext(resp.aiter_lines()), 10)
                    assert first == "event: view"
        # The page's one-time `?token=` exchange works with the reader token too.
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as browser:
            first = await browser.get("/?token=reader-secret")
            assert first.status_code == 303 and "token" not in first.headers["location"]
            assert (await browser.get("/")).status_code == 200
            async with browser.stream("GET", "/api/stream") as resp:
                assert resp.status_code == 200
    finally:
        await server.stop()
        await dash.stop()
    require_token_off_loopback("0.0.0.0", None, "reader-secret")
    with pytest.raises(ValueError, match="open to the network"):
        require_token_off_loopback("0.0.0.0", None, None)
