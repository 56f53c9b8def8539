"""`gridctl status` lists each active workload: a real controller folds `auto` request telemetry
from the real log, admits the workload onto its model and plans it; status (JSON and table,
through gridctl as a child process) says which model it got and whether it serves, starts or
waits, and a workload seen once waits for evidence."""

from __future__ import annotations

import time
from pathlib import Path

from grid.events.base import new_event_id
from grid.events.control import ModelProfile, ProfileSet
from grid.events.requests import RequestBatch, RequestFeatures
from grid.transport.jetstream import JetStreamLog

from tests.heartbeats import heartbeat
from tests.integration.controller.statuskit import serving_controller, status_until
from tests.integration.controller.test_cli_admin import gridctl


def auto(workload: str) -> RequestFeatures:
    return RequestFeatures(endpoint="chat", requested_model="auto", served_model=None, workload=workload, auto=True,
                           outcome="unavailable", status_code=503, finished_at=time.time())


async def test_status_lists_each_active_workload(js_log: JetStreamLog, tmp_path: Path) -> None:
    async def beat() -> None:
        await js_log.append(heartbeat("host-a"))

    await beat()
    await js_log.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=ModelProfile(
        model_id="coder", memory_mb=300, artifact_sha256="ab" * 32, workload_scores={"coding": 0.9})))
    # Coding was asked for three times (admitted); research once (below the evidence gate).
    await js_log.append(RequestBatch(event_id=new_event_id(), at=time.time(), source="gw",
                                     records=(auto("coding"), auto("coding"), auto("coding"), auto("research"))))
    home = tmp_path / "home"
    async with serving_controller(js_log, home, "ctl-workloads"):
        doc = await status_until(home, beat, lambda d: any(r["workload"] == "coding" and r["placed"]
                                                                for r in d["workloads"]), "a plan for coding")
        rows = {r["workload"]: r for r in doc["workloads"]}
        coding = rows["coding"]
        # Placed on host-a, nothing ready there (no agent runs it): starting.
        assert (coding["state"], coding["model_id"], coding["ready"]) == ("starting", "coder", 0), coding
        research = rows["research"]
        assert research["state"] == "waiting_for_evidence" and research["detail"].startswith("1 of 3 observations")
        rc, out, err = await gridctl(home, "status")
        assert rc == 0, err
        assert "Workloads (auto traffic)" in out and "waiting_for_evidence" in out, out
        assert any("coding" in line and "starting" in line and "coder" in line for line in out.splitlines()), out
