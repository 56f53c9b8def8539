"""`gridctl status` shows each host's qualifications with their age, and a real controller plans a
profile that requires qualification only onto the host whose recorded qualification passed,
naming why the other host was excluded."""

from __future__ import annotations

import json
import time
from pathlib import Path

from grid.events.base import new_event_id
from grid.events.host import QualificationRecorded, QualificationStep
from grid.fleet.reasons import NOT_QUALIFIED
from grid.transport.jetstream import JetStreamLog

from tests.heartbeats import heartbeat
from tests.integration.controller.statuskit import serving_controller, status_until
from tests.integration.controller.test_cli_admin import gridctl

SHA = "ab" * 32


async def test_status_shows_qualifications_and_the_plan_uses_only_qualified_hosts(js_log: JetStreamLog,
                                                                                   tmp_path: Path) -> None:
    async def beat() -> None:
        for host in ("host-a", "host-b"):
            await js_log.append(heartbeat(host))

    await js_log.append(QualificationRecorded(
        event_id=new_event_id(), at=time.time(), host_id="host-a", runtime="llama.cpp", model_id="m",
        artifact_sha256=SHA, result="passed", steps=(QualificationStep(name="inventory", ok=True),)))
    await js_log.append(QualificationRecorded(
        event_id=new_event_id(), at=time.time(), host_id="host-b", runtime="llama.cpp", model_id="m",
        artifact_sha256=SHA, result="failed", failed_step="inference", reason="engine_exited"))
    home = tmp_path / "home"
    async with serving_controller(js_log, home, "ctl-qualified"):
        rc, out, err = await gridctl(home, "model", "set", "m", "--memory-mb", "300", "--artifact-sha256", SHA,
                                     "--min-replicas", "2", "--max-replicas", "2", "--require-qualified", "--json")
        assert rc == 0, err
        assert json.loads(out)["profile"]["require_qualified"] is True, out
        doc = await status_until(home, beat, lambda d: d["plan"] is not None and d["plan"]["placements"],
                                 "a recorded plan placing m")
        assert {(p["host_id"], p["model_id"]) for p in doc["plan"]["placements"]} == {("host-a", "m")}
        hosts = {h["host_id"]: h for h in doc["hosts"]}
        [qa] = hosts["host-a"]["qualifications"]
        assert (qa["runtime"], qa["model_id"], qa["result"]) == ("llama.cpp", "m", "passed")
        assert qa["age_seconds"] >= 0
        [qb] = hosts["host-b"]["qualifications"]
        assert (qb["result"], qb["failed_step"], qb["reason"]) == ("failed", "inference", "engine_exited")
        assert [(x["model_id"], x["host_id"], x["reason"]) for x in doc["qualification_exclusions"]] == [
            ("m", "host-b", NOT_QUALIFIED)]
        [explained] = [e for e in doc["plan"]["explanations"] if e["model_id"] == "m"]
        assert {(r["host_id"], r["reason"]) for r in explained["rejected"]} == {("host-b", NOT_QUALIFIED)}
        rc, out, err = await gridctl(home, "status")
        assert rc == 0, err
        assert "Qualifications" in out and "failed at inference (engine_exited)" in out, out
        assert "m excludes host host-b: not_qualified" in out, out
