"""`gridctl status` tells "cannot be placed" (with the reason) from "loading", as the gateway does.

A real controller plans against a heartbeat in the real log; status (JSON and table, through the
admin API and gridctl as a child process) must give the verdict the gateway's 503 gives: a model
too big for any host and a model whose weights no host has and no source names cannot be
placed; a placeable model that is not ready yet is absent from the list.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from grid.events.base import new_event_id
from grid.events.control import ModelProfile, ProfileSet
from grid.events.host import CachedArtifact
from grid.transport.jetstream import JetStreamLog

from tests.heartbeats import heartbeat
from tests.integration.controller.statuskit import serving_controller, status_until
from tests.integration.controller.test_cli_admin import gridctl

SHA = "ab" * 32


async def test_status_shows_why_a_model_cannot_be_placed(js_log: JetStreamLog, tmp_path: Path) -> None:
    async def beat() -> None:
        await js_log.append(heartbeat(
            "host-a", cached=(CachedArtifact(model_id="cached.gguf", sha256=SHA, size_bytes=100 << 20),),
        ))

    async def profile(p: ModelProfile) -> None:
        await js_log.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=p))

    await beat()
    await profile(ModelProfile(model_id="huge", memory_mb=900_000, artifact_sha256=SHA, min_replicas=1))
    await profile(ModelProfile(model_id="small", memory_mb=300, artifact_sha256=SHA, min_replicas=1))
    await profile(ModelProfile(model_id="ghost", memory_mb=300))  # no sha, no source, cached nowhere
    home = tmp_path / "home"
    async with serving_controller(js_log, home, "ctl-unplaceable"):
        doc = await status_until(home, beat, lambda d: any(r["model_id"] == "huge" for r in d["unplaceable"]),
                                 "a plan with a shortfall for 'huge'")
        rows = {r["model_id"]: r for r in doc["unplaceable"]}
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
