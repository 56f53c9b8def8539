"""The gateway's process entry: `gridctl serve gateway`, over a real
nats-server, started and stopped the way a process manager does it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import httpx

from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import JetStreamLog


async def _start(args: list[str], home: Path, nats_url: str | None) -> tuple[asyncio.subprocess.Process, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GRID_NATS_URL", "GRID_GATEWAY_API_KEYS")}
    env["GRID_HOME"] = str(home)
    if nats_url is not None:
        env["GRID_NATS_URL"] = nats_url
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 60.0)).decode().strip()
    return proc, line


async def _stop(proc: asyncio.subprocess.Process) -> tuple[int, bytes]:
    proc.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(proc.communicate(), 30.0)
    assert proc.returncode is not None
    return proc.returncode, err


async def test_serve_gateway_serves_logs_json_and_stops_on_sigterm(
    nats_server: EmbeddedNats, js_log: JetStreamLog, tmp_path: Path
) -> None:
    # js_log gives this test fresh streams: no host another test left ready is listed.
    home = tmp_path / "home"
    proc, line = await _start(["-m", "grid.cli.main", "serve", "gateway", "--port", "0", "--log-format", "json"], home, nats_server.url)
    try:
        assert line.startswith("gateway http://127.0.0.1:") and line.endswith("/v1"), line
        url = line.removeprefix("gateway ").removesuffix("/v1")
        assert (home / "gateway.url").read_text().strip() == url
        async with httpx.AsyncClient(base_url=url, timeout=10.0) as http:
            assert (await http.get("/gateway/health")).json() == {"status": "ok", "ready_models": 0}
            assert (await http.get("/v1/models")).json() == {"data": [], "object": "list"}
    finally:
        code, err = await _stop(proc)
    assert code == 0, err.decode()
    assert not (home / "gateway.url").exists()
    logged = [json.loads(raw) for raw in err.decode().splitlines() if raw.startswith("{")]
    assert {"event": "gateway serving", "url": url, "level": "info"}.items() <= logged[0].items()


async def test_gridctl_serve_gateway_finds_the_recorded_nats_url(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "nats.url").write_text(nats_server.url + "\n")
    proc, line = await _start(["-m", "grid.cli.main", "serve", "gateway", "--port", "0"], home, None)
    try:
        assert line.startswith("gateway http://127.0.0.1:"), line
    finally:
        code, err = await _stop(proc)
    assert code == 0, err.decode()


async def test_without_any_nats_url_it_refuses_to_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRID_NATS_URL"}
    env["GRID_HOME"] = str(tmp_path / "empty-home")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "grid.cli.main", "serve", "gateway", env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60.0)
    assert proc.returncode == 1
    assert "GRID_NATS_URL" in (out + err).decode()
