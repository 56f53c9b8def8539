"""`gridctl status` lists each active workload: a real controller folds `auto` request telemetry
from the real log, admits the workload onto its model and plans it; status (JSON and table,
through gridctl as a child process) gives one admission row per active workload: which model it
got, the desired/planned/ready/missing replicas, eligible hosts, startup estimate and the reason;
a workload seen once is deferred below the evidence gate, its demand still visible."""

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
        doc = await status_until(home, beat, lambda d: any(r["workload"] == "coding" and r["planned"]
                                                                for r in d["workloads"]), "a plan for coding")
        rows = {r["workload"]: r for r in doc["workloads"]}
        coding = rows["coding"]
        # Placed on host-a, no process there yet (no agent runs it): planned.
        assert (coding["state"], coding["model_id"], coding["reason"]) == ("planned", "coder", "placed_not_started")
        assert (coding["desired"], coding["planned"], coding["ready"], coding["missing"]) == (1, 1, 0, 1), coding
        assert coding["eligible_hosts"] == 1 and coding["startup_seconds"] == 45.0, coding  # 30 s load + 15 s warm
        research = rows["research"]
        assert (research["state"], research["reason"]) == ("deferred", "below_evidence_gate"), research
        assert research["detail"].startswith("1 of 3 observations")
        rc, out, err = await gridctl(home, "status")
        assert rc == 0, err
        assert "Workloads (auto traffic)" in out and "below_evidence_gate" in out, out
        assert any("coding" in line and "planned" in line and "coder" in line for line in out.splitlines()), out
