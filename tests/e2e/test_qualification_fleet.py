"""Runtime qualification in a test fleet (real NATS with identities, controller, gateway, two agents
that joined by invitation, llama.cpp with the SmolLM2 GGUF): `gridctl qualify llama.cpp` on the
second host records its evidence with that host's own credential, and once the bundled model's
profile requires qualification the controller places it only there, with status showing the
qualification, its age and why the first host is excluded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from grid.agent.artifacts import BUNDLED_MODEL_ID, BUNDLED_SHA256
from grid.agent.engines.runtime import Runtime
from grid.fleet.reasons import NOT_QUALIFIED
from grid.testfleet import fleet as fleetlib
from grid.testfleet.state import FleetManifest, load_state
from tests.e2e.test_external_engine import wait_until
from tests.integration.testfleet.test_fleet_cli import gridctl, seed_fleet_models
from tests.ports import engine_ports, fleet_engine_port_base

pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.slow]


@pytest.fixture
def fleet(tmp_path: Path, bundled_model_home: Path, engine_runtime: Runtime) -> Iterator[FleetManifest]:
    home = tmp_path / "home"
    seed_fleet_models(home, bundled_model_home)
    try:
        started = gridctl(home, "test", "start", "--machines", "2", "--engine-port-base",
                          str(fleet_engine_port_base(2)), "--json", timeout=300)
        assert started.returncode == 0, started.stderr
        state = load_state(home / "testfleet")
        assert state is not None
        yield state
    finally:
        stopped = gridctl(home, "test", "stop", timeout=240)
        assert stopped.returncode == 0, stopped.stderr


def test_a_profile_requiring_qualification_is_placed_only_on_the_host_that_qualified(fleet: FleetManifest) -> None:
    qualified = fleet.hosts[-1]
    others = {h.host_id for h in fleet.hosts} - {qualified.host_id}
    lo, hi = engine_ports(8)
    env = {k: v for k, v in os.environ.items() if k not in ("GRID_NATS_URL", "GRID_AGENT_STATE_DIR")} | {
        "GRID_HOME": qualified.home, "COLUMNS": "400"}
    done = subprocess.run([sys.executable, "-m", "grid.cli.main", "qualify", "llama.cpp", BUNDLED_MODEL_ID,
                           "--state-dir", str(Path(qualified.home) / "agent"), "--port-range", f"{lo}-{hi}",
                           "--engine-threads", "1", "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    doc = json.loads(done.stdout)
    assert (doc["host_id"], doc["result"], doc["artifact_sha256"]) == (qualified.host_id, "passed", BUNDLED_SHA256)

    fleetlib.admin_request(fleet, "PATCH", f"/allocator/models/{BUNDLED_MODEL_ID}",
                           {"require_qualified": True, "min_replicas": 1, "max_replicas": 2})

    def placed_only_there() -> dict[str, Any] | None:
        status = fleetlib.admin_request(fleet, "GET", "/allocator/status")
        plan = status["plan"] or {}
        hosts = {p["host_id"] for p in plan.get("placements") or () if p["model_id"] == BUNDLED_MODEL_ID}
        excluded = {x["host_id"] for x in status["qualification_exclusions"] if x["model_id"] == BUNDLED_MODEL_ID}
        return status if hosts == {qualified.host_id} and excluded == others else None

    status = wait_until("the plan placing the model only on the qualified host", placed_only_there, timeout=60)
    assert all(x["reason"] == NOT_QUALIFIED for x in status["qualification_exclusions"])
    [q] = next(h for h in status["hosts"] if h["host_id"] == qualified.host_id)["qualifications"]
    assert (q["runtime"], q["model_id"], q["result"]) == ("llama.cpp", BUNDLED_MODEL_ID, "passed")
    assert q["age_seconds"] >= 0
    # And no managed copy is left serving on a host that did not qualify once the move completes.
    wait_until("the unqualified hosts to hold no ready copy", lambda: not any(
        r["model_id"] == BUNDLED_MODEL_ID and r["managed"] and r["state"] == "ready"
        for h in fleetlib.admin_request(fleet, "GET", "/allocator/status")["hosts"] if h["host_id"] in others
        for r in h["residencies"]), timeout=120)
