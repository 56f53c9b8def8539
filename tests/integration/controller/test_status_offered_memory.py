"""`gridctl status` says how much memory the planner may use on each host and why it is less than
the host has: a throttled host offers only its throttle fraction, so a plan's
`insufficient_memory` beside a host showing plenty free reads as a contradiction otherwise."""

from __future__ import annotations

import time
from pathlib import Path

from grid.events.base import new_event_id
from grid.events.control import ModelProfile, ProfileSet
from grid.events.host import CachedArtifact, HostResources
from grid.transport.jetstream import JetStreamLog

from tests.heartbeats import heartbeat
from tests.integration.controller.statuskit import serving_controller, status_until
from tests.integration.controller.test_cli_admin import gridctl

SHA = "cd" * 32


async def test_status_shows_what_a_throttled_host_offers_the_planner(js_log: JetStreamLog, tmp_path: Path) -> None:
    cached = (CachedArtifact(model_id="mid", sha256=SHA, size_bytes=100 << 20),)

    async def beat() -> None:
        # 4000 MiB, 1000 of them reserved, throttled at half: the planner may use 1500.
        await js_log.append(heartbeat("host-t", state="throttled", cached=cached,
                                      resources=HostResources(capacity_mb=4000, reserved_mb=1000)))
        await js_log.append(heartbeat("host-a", cached=cached, resources=HostResources(capacity_mb=1200)))

    await beat()
    # Fits host-t's free memory (3000 MiB) but not the 1500 it offers while throttled.
    await js_log.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=ModelProfile(
        model_id="mid", memory_mb=2000, artifact_sha256=SHA, min_replicas=1)))
    home = tmp_path / "home"
    async with serving_controller(js_log, home, "ctl-offered"):
        doc = await status_until(home, beat, lambda d: any(
            (m["shortfall"] or {}).get("reason") for m in d["models"] if m["model_id"] == "mid"),
            "a plan with a shortfall for 'mid'")
        hosts = {h["host_id"]: h for h in doc["hosts"]}
        t, a = hosts["host-t"], hosts["host-a"]
        assert t["free_mb"] == 3000 and (t["offered_mb"], t["planner_free_mb"]) == (1500, 1500), t
        assert t["offered_reasons"] == ["reserve: 1000 MiB", "throttled: offers 50%"], t
        assert (a["offered_mb"], a["offered_reasons"]) == (1200, []), a
        rc, out, err = await gridctl(home, "status")
        assert rc == 0, err
        row = next(line for line in out.splitlines() if "host-t" in line and "throttled" in line)
        assert "1500/1500 (reserve: 1000 MiB; throttled: offers 50%)" in row, out
