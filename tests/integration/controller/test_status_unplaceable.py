"""`gridctl status` tells "cannot be placed" (with the reason) from "loading", as the gateway does.

A real controller plans against a heartbeat in the real log; status (JSON and table, through the
admin API and gridctl as a child process) must give the verdict the gateway's 503 gives: a model
too big for any host and a model whose weights no host has and no source names cannot be
placed; a placeable model that is not ready yet is absent from the list.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from grid.controller.api import serve_admin
from grid.controller.service import Controller, ControllerSettings
from grid.events.base import new_event_id
from grid.events.control import ModelProfile, ProfileSet
from grid.events.host import CachedArtifact, HostHeartbeat, HostResources
from grid.events.jetstream import JetStreamLog

from tests.integration.controller.test_cli_admin import gridctl

SHA = "ab" * 32
SETTINGS = ControllerSettings(tick_interval_seconds=0.3, coalesce_seconds=0.02, lease_ttl_seconds=3.0,
                              lease_renew_seconds=0.5, restart_grace_seconds=0.0)


async def test_status_shows_why_a_model_cannot_be_placed(js_log: JetStreamLog, tmp_path: Path) -> None:
    async def heartbeat() -> None:
        await js_log.append(HostHeartbeat(
            event_id=new_event_id(), at=time.time(), host_id="host-a", resources=HostResources(capacity_mb=16000),
            cached=(CachedArtifact(model_id="cached.gguf", sha256=SHA, size_bytes=100 << 20),),
        ))

    async def profile(p: ModelProfile) -> None:
        await js_log.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=p))

    await heartbeat()
    await profile(ModelProfile(model_id="huge", memory_mb=900_000, artifact_sha256=SHA, min_replicas=1))
    await profile(ModelProfile(model_id="small", memory_mb=300, artifact_sha256=SHA, min_replicas=1))
    await profile(ModelProfile(model_id="ghost", memory_mb=300))  # no sha, no source, cached nowhere
    home = tmp_path / "home"
    ctl = Controller(js_log, home, settings=SETTINGS, controller_id="ctl-unplaceable")
    await ctl.start()
    admin = await serve_admin(ctl, "127.0.0.1", 0)
    try:
        deadline = time.monotonic() + 20
        while True:
            await heartbeat()
            rc, out, err = await gridctl(home, "status", "--json")
            assert rc == 0, err
            rows = {r["model_id"]: r for r in json.loads(out)["unplaceable"]}
            if "huge" in rows:
                break
            assert time.monotonic() < deadline, f"no plan with a shortfall for 'huge' reached status: {rows}"
            await asyncio.sleep(0.3)
        assert rows["huge"]["reason"] == "no_eligible_host" and "insufficient_memory" in rows["huge"]["detail"]
        assert rows["ghost"]["reason"] == "artifact_unknown"
        assert "small" not in rows  # placeable: loading, not "cannot be placed"
        rc, out, err = await gridctl(home, "status")
        assert rc == 0, err
        assert "cannot be placed: huge (no_eligible_host)" in out, out
        assert "cannot be placed: ghost (artifact_unknown)" in out, out
        assert "cannot be placed: small" not in out

        # Fix the profile: the verdict goes away (the next plan judges it, never the stale one).
        await profile(ModelProfile(model_id="huge", memory_mb=300, artifact_sha256=SHA, min_replicas=1))
        rc, out, err = await gridctl(home, "status", "--json")
        assert rc == 0, err
        assert "huge" not in {r["model_id"] for r in json.loads(out)["unplaceable"]}
    finally:
        await admin.stop()
        await ctl.stop()
