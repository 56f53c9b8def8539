""""Loading" vs "cannot be placed": a real controller plans against a heartbeat in the real log,
and the gateway answers from that plan's shortfall (and from the fleet's cached artifacts)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from grid.controller.service import Controller, ControllerSettings
from grid.events.base import new_event_id
from grid.events.control import ModelProfile
from grid.events.host import CachedArtifact, HostHeartbeat, HostResources
from grid.transport.jetstream import JetStreamLog

from .conftest import GatewayFactory

pytestmark = pytest.mark.slow

SHA = "ab" * 32
SETTINGS = ControllerSettings(tick_interval_seconds=0.3, coalesce_seconds=0.02, lease_ttl_seconds=3.0,
                              lease_renew_seconds=0.5, restart_grace_seconds=0.0)


async def test_cannot_be_placed_is_distinct_from_loading(make_gateway: GatewayFactory, js_log: JetStreamLog,
                                                         tmp_path: Path) -> None:
    gw = await make_gateway()

    async def heartbeat() -> None:
        await js_log.append(HostHeartbeat(
            event_id=new_event_id(), at=time.time(), host_id="host-a", resources=HostResources(capacity_mb=16000),
            cached=(CachedArtifact(model_id="cached.gguf", sha256=SHA, size_bytes=100 << 20),),
        ))

    await heartbeat()
    await gw.profile(ModelProfile(model_id="huge", memory_mb=900_000, artifact_sha256=SHA, min_replicas=1))
    await gw.profile(ModelProfile(model_id="small", memory_mb=300, artifact_sha256=SHA, load_seconds=20.0,
                                  warm_seconds=5.0))
    await gw.profile(ModelProfile(model_id="ghost", memory_mb=300))  # no sha, no source, cached nowhere

    async def ask(model: str):  # type: ignore[no-untyped-def]
        return await gw.http.post("/v1/chat/completions", headers=gw.auth_headers(),
                                  json={"model": model, "messages": [{"role": "user", "content": "hi"}]})

    # Before any plan: the artifact verdict needs no plan; "huge" is still just not ready.
    r = await ask("ghost")
    assert r.status_code == 503 and "retry-after" not in r.headers
    assert r.json()["error"]["code"] == "model_cannot_be_placed"
    assert r.headers["x-grid-reason"] == "artifact_unknown" and "artifact_unknown" in r.json()["error"]["message"]

    ctl = Controller(js_log, tmp_path / "ctl-home", settings=SETTINGS, controller_id="ctl-placed")
    await ctl.start()
    try:
        deadline = time.monotonic() + 20
        while True:
            await heartbeat()
            r = await ask("huge")
            if r.json()["error"]["code"] == "model_cannot_be_placed":
                break
            assert r.json()["error"]["code"] == "model_not_ready", r.text
            assert time.monotonic() < deadline, "no plan with a shortfall for 'huge' reached the gateway"
            await asyncio.sleep(0.3)
        assert r.status_code == 503 and "retry-after" not in r.headers
        assert r.headers["x-grid-reason"] == "no_eligible_host"
        assert "insufficient_memory" in r.json()["error"]["message"]

        r = await ask("small")  # placeable, just not ready: the honest retry answer
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_ready"
        assert int(r.headers["retry-after"]) == 25 and "x-grid-reason" not in r.headers

        # Fix the profile: the next plan judges it, never the stale one.
        await gw.profile(ModelProfile(model_id="huge", memory_mb=300, artifact_sha256=SHA, min_replicas=1))
        r = await ask("huge")
        assert r.json()["error"]["code"] == "model_not_ready", r.text
        assert (await gw.stats())["requests"]["cannot_be_placed"] >= 2
    finally:
        await ctl.stop()
