"""serve_gateway: in-process uvicorn, gateway.url written while serving and removed after."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from grid.config import GridConfig
from grid.events.log import InMemoryLog
from grid.gateway.app import create_gateway_app, serve_gateway
from grid.transport.embedded import free_port
from tests.heartbeats import heartbeat


async def test_serve_gateway_until_cancelled(tmp_path: Path) -> None:
    app = create_gateway_app(InMemoryLog(), GridConfig(home=tmp_path, nats_url=None), api_keys=[])
    port = free_port()
    task = asyncio.create_task(serve_gateway(app, "127.0.0.1", port))
    url_file = tmp_path / "gateway.url"
    for _ in range(200):
        if url_file.exists():
            break
        await asyncio.sleep(0.02)
    assert url_file.read_text().strip() == f"http://127.0.0.1:{port}"
    assert url_file.stat().st_mode & 0o077 == 0
    async with httpx.AsyncClient() as c:
        health = await c.get(f"http://127.0.0.1:{port}/gateway/health")
        assert health.json() == {"status": "ok", "ready_models": 0}
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    assert not url_file.exists()
    assert app.state.gateway.started is False


async def test_startup_replays_only_the_recent_tail_of_host_events(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import time

    from grid.events.host import Residency
    from grid.gateway import state as state_module

    from tests.placement import Placements

    log = InMemoryLog()
    await Placements(log).place("live", "m-live")  # the plan and the warm ack come first
    for i in range(30):  # an old host that later went quiet, then many heartbeats of a live one
        host = "old" if i < 10 else "live"
        await log.append(heartbeat(
            host, Residency(model_id=f"m-{host}", memory_mb=1, state="ready", endpoint="http://x:1"), capacity_mb=1,
        ))
    monkeypatch.setattr(state_module, "HOST_REPLAY_MAX_MESSAGES", 5)
    monkeypatch.setattr(state_module, "ACK_SCAN_IDLE_SECONDS", 0.05)
    gw = state_module.Gateway(log, GridConfig(home=tmp_path, nats_url=None), api_keys=[])
    await gw.start()
    try:
        assert sorted(gw.runner["fleet"].hosts) == ["live"]
        assert gw.runner.positions["GRID_HOSTS"] == 31
        assert gw.ready_models(time.time()) == ["m-live"]
    finally:
        await gw.stop()
