"""`gridctl test demo --workload-model ...`: the adaptive workday on a three-machine fleet with two
larger hosts, real engines, real requests and the real allocator (no injected demand, no
synthetic inference). Loopback machines: the day is about placement, not the network.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from grid.agent.engines.runtime import Runtime
from grid.testfleet import workday as wd
from tests.integration.testfleet.test_fleet_cli import gridctl, seed_fleet_models

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CODER, SHARED = "coder-sm", "shared-sm"
BINDINGS = (f"coding={CODER}", f"research={SHARED}", f"marketing={SHARED}", f"sales={SHARED}")


@pytest.fixture(scope="module")
def fleet_home(tmp_path_factory: pytest.TempPathFactory, bundled_model_home: Path,
               engine_runtime: Runtime) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("workday-home")
    seed_fleet_models(home, bundled_model_home)
    try:
        started = gridctl(home, "test", "start", "--machines", "3", "--capacities-gib", "1,5,5", "--json",
                          timeout=300)
        assert started.returncode == 0, started.stderr
        yield home
    finally:
        stopped = gridctl(home, "test", "stop", timeout=240)
        assert stopped.returncode == 0, stopped.stderr


@pytest.mark.timeout(900)
def test_the_fleet_follows_the_workday_and_every_mix_is_answered(fleet_home: Path, tmp_path: Path) -> None:
    args = [a for b in BINDINGS for a in ("--workload-model", b)]
    # 2 s buckets: a 30 s evidence gate keeps the day (and the suite) short.
    done = gridctl(fleet_home, "test", "demo", *args, "--max-tokens", "8", "--bucket-seconds", "2", "--json",
                   timeout=840)
    # The day's narrative (every transition, forecast and plan change) stays beside the test's
    # other files: a failure names what to read there.
    (tmp_path / "workday.log").write_text(done.stderr)
    report = json.loads(done.stdout)
    failed = [r for r in report["requirements"] if not r["ok"]]
    assert done.returncode == 0 and report["passed"], f"{failed}\n{done.stderr[-12000:]}"
    assert report["mode"] == "workday"
    assert {r["name"] for r in report["requirements"]} >= {
        wd.REQ_FORECAST_WINDOW, wd.REQ_BASELINE_ON_SMALL_HOST, wd.REQ_SPECIALISTS_PLACED, wd.REQ_SPECIALISTS_ANSWER,
        wd.REQ_SURGE, wd.REQ_SURGE_ANSWERS, wd.REQ_RETURN, wd.REQ_RETURN_ANSWERS, wd.REQ_COOLDOWN,
        wd.REQ_LIFECYCLES}
    baseline = report["baseline_model"]

    # The surge displaced both specialists by preemption (not by their demand expiring), and the
    # baseline replicas it brought went away again once it stopped.
    drains = [c for c in report["commands"] if c["kind"] == "drain"]
    assert {c["model_id"] for c in drains if "preemption" in c["reason"]} == {CODER, SHARED}, drains
    assert any(c["model_id"] == baseline and "scale_down" in c["reason"] for c in drains), drains
    # The specialist and the shared model each ran on a larger host, never on the smaller one.
    lifecycles = report["lifecycles"]
    optional_hosts = {key.split("/", 1)[0] for key in lifecycles if key.split("/", 1)[1] in (CODER, SHARED)
                      and any(step["to"] == "ready" for step in lifecycles[key])}
    assert optional_hosts == {"h2", "h3"}, lifecycles

    # Every phase was answered with genuine completions, and each phase's counts add up.
    phases = report["phases"]
    assert len(phases) == 4 and all(p["sent"] == p["answered"] + p["failed"] for p in phases)
    assert all(p["answered"] > 0 for p in phases[:3])
    served = [a for a in report["answers"] if a["status"] == 200]
    assert served and all(a["ok"] and a["response_id"] and a["completion_tokens"] > 0 for a in served)
    assert {a["served_model"] for a in served} >= {baseline, CODER, SHARED}
