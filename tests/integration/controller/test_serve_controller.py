"""`gridctl serve controller`: the controller's one process entry, as a real process on real NATS."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import httpx

from grid.events.base import new_event_id
from grid.events.control import ModelProfile, ProfileSet
from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import JetStreamLog
from tests.integration.controller.simhost import wait_for


async def test_serve_controller_runs_the_admin_api_and_stops_cleanly(nats_server: EmbeddedNats, js_log: JetStreamLog,
                                                                     tmp_path: Path) -> None:
    await js_log.append(ProfileSet(event_id=new_event_id(), at=0, profile=ModelProfile(model_id="m", memory_mb=100)))
    home = tmp_path / "home"
    env = {**os.environ, "GRID_HOME": str(home), "GRID_NATS_URL": nats_server.url}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "grid.cli.main", "serve", "controller", "--port", "0", "--tick-interval", "0.3",
        "--lease-ttl", "3", "--lease-renew", "0.5", "--restart-grace", "0", "--log-format", "json",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )
    url_file = home / "admin.url"
    try:
        await wait_for(url_file.exists, timeout=30)
        url = url_file.read_text().strip()
        async with httpx.AsyncClient(base_url=url, timeout=5.0) as client:
            status = (await client.get("/allocator/status")).json()
        assert status["controller"]["admin_url"] == url
        assert [p["model_id"] for p in status["profiles"]] == ["m"]
        # Settings given on the command line reach the controller.
        assert status["controller"]["lease"]["ttl_seconds"] == 3.0
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        _out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, err.decode()
    assert not url_file.exists()  # the admin server removed the URL it wrote
    assert (home / "snapshots" / "controller.snapshot").exists()  # and the controller saved its state
