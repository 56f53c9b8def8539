"""`gridctl test demo` on a two-machine namespace fleet: the focused coding flow with real engines,
real requests and the real allocator (no injected demand, no synthetic inference).

The tests share one fleet and run in file order: the demo first, then a second run refused
because the first run's coding demand still holds the coding model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from grid.agent.engines.runtime import Runtime
from grid.testfleet import demo as demolib
from grid.testfleet.netns import PREFIX, existing_namespaces
from tests import machine_lock
from tests.integration.testfleet.test_fleet_cli import gridctl, seed_fleet_models

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

USERS = 3
REQUESTS = 6


@pytest.fixture(scope="module")
def fleet_home(tmp_path_factory: pytest.TempPathFactory, bundled_model_home: Path,
               engine_runtime: Runtime) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("demo-home")
    seed_fleet_models(home, bundled_model_home)
    with machine_lock.turn(machine_lock.NETNS_FLEET):
        try:
            started = gridctl(home, "test", "start", "--machines", "2", "--netns", "--json", timeout=300)
            assert started.returncode == 0, started.stderr
            yield home
        finally:
            stopped = gridctl(home, "test", "stop", timeout=240)
            assert stopped.returncode == 0, stopped.stderr
        assert not {n for n in existing_namespaces() if n.startswith(PREFIX)}, "a namespace was left behind"


def _demo(home: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    done = gridctl(home, "test", "demo", "--users", str(USERS), "--requests", str(REQUESTS), "--max-tokens", "8",
                   "--json", *args, timeout=600)
    return done.returncode, json.loads(done.stdout), done.stderr


@pytest.mark.timeout(600)
def test_the_allocator_warms_the_coding_model_from_refused_auto_requests_and_both_models_answer(
        fleet_home: Path) -> None:
    code, report, stderr = _demo(fleet_home)
    failed = [r for r in report["requirements"] if not r["ok"]]
    assert code == 0 and report["passed"], f"{failed}\n{stderr[-3000:]}"
    names = {r["name"] for r in report["requirements"]}
    assert names >= {demolib.REQ_BASELINE_ONE_REPLICA, demolib.REQ_BASELINE_ANSWERS, demolib.REQ_AUTO_HONEST_503,
                     demolib.REQ_CODING_WARMED_UNNAMED, demolib.REQ_CODING_ANSWERS, demolib.REQ_PERSONAS_ANSWERED,
                     demolib.REQ_ANSWERS_COMPLETE, demolib.REQ_PERFORMANCE_SAMPLES, demolib.REQ_LIFECYCLE}
    baseline, coding = report["baseline_model"], report["coding_model"]
    answers = report["answers"]

    # Three distinct users were refused honestly, and nothing named the coding model before the
    # allocator had loaded it for their demand.
    auto = [a for a in answers if a["model"] == "auto"]
    assert len({a["persona"] for a in auto}) == USERS and all(a["status"] == 503 for a in auto)
    loads = [c for c in report["commands"] if c["model_id"] == coding and c["kind"] == "load"]
    assert loads, report["commands"]
    # A load stages the artifact; the allocator may stage it on more than one host and warm one
    # (seen: loads on h1 and h2, warm on h2 only), so some loaded host reaches READY after its load.
    coding_ready = [t for load in loads for t in report["lifecycles"].get(f"{load['host_id']}/{coding}", [])
                    if t["to"] == "ready" and t["at"] >= load["at"]]
    assert coding_ready, (loads, report["lifecycles"])
    assert report["coding_workload"]["status"] == "admitted"
    assert any(t["kind"] == "command" and coding in t["text"] for t in report["timeline"])
    assert report["coding_workload"]["model_id"] == coding

    # Every answer is a genuine completion; the personas reached both models with their own keys.
    served = [a for a in answers if a["model"] != "auto"]
    assert served and all(a["ok"] and a["response_id"] and a["completion_tokens"] > 0 and a["latency_ms"] > 0
                          for a in served)
    personas = [a for a in served if a["persona"].startswith("persona-")]
    assert len(personas) == REQUESTS and {a["model"] for a in personas} == {baseline, coding}
    assert {a["served_model"] for a in personas} == {baseline, coding}
    counts = report["counts"]
    assert counts["auto"]["refused"] == USERS and counts[coding]["answered"] == REQUESTS // 2 + 1
    # Client-side samples per host name the host that served each answer.
    sampled = {m for row in report["performance"].values() for m in row}
    assert sampled == {baseline, coding}


def test_a_second_run_waits_for_the_held_coding_model_and_fails_when_it_is_still_there(fleet_home: Path) -> None:
    # The first run's coding demand is retained (the demo never clears it), so the fleet is not
    # idle: with no time to wait, the run fails its first requirement and exits non-zero.
    code, report, _ = _demo(fleet_home, "--converge-timeout", "1")
    assert code == 1 and not report["passed"]
    first = report["requirements"][0]
    assert first["name"] == demolib.REQ_BASELINE_ONE_REPLICA and not first["ok"]
    assert "coding model live on [" in first["detail"], first["detail"]
    assert report["answers"] == []
