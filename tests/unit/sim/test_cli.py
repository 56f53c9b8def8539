"""gridctl test scenario / graduate: options, byte-stable JSON, clear refusals."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from grid.cli.main import app

runner = CliRunner()
BASE = ["test", "scenario", "--machines", "4", "--users", "15", "--hours", "0.5", "--seed", "5"]


def test_scenario_json_is_byte_stable_and_complete() -> None:
    a = runner.invoke(app, BASE + ["--json"])
    b = runner.invoke(app, BASE + ["--json"])
    assert a.exit_code == 0, a.output
    assert a.stdout_bytes == b.stdout_bytes
    body = json.loads(a.stdout)
    for key in ("served_demand", "least_workload_service", "slo_attainment", "churn", "cold_starts",
                "evening_memory_gib", "disk_used_gib", "recommendations", "safety_violations", "workloads"):
        assert key in body
    assert body["strategy"] == "smart" and body["minutes"] == 30


def test_scenario_with_oracle_timeline_and_trace(tmp_path: Path) -> None:
    csv = tmp_path / "coding.csv"
    csv.write_text("0,1\n600,9\n1200,1\n")
    res = runner.invoke(app, BASE + ["--oracle", "--timeline", "--strategy", "greedy",
                                     "--workload-trace", f"coding={csv}"])
    assert res.exit_code == 0, res.output
    assert "strategy greedy" in res.stdout and "oracle (hindsight" in res.stdout and "timeline:" in res.stdout


def test_bad_input_is_refused_clearly(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("0,1\n0,2\n")
    cases = [
        (BASE + ["--workload-trace", f"coding={bad}"], "strictly increasing"),
        (BASE + ["--workload-trace", "coding"], "WORKLOAD=CSV"),
        (BASE + ["--strategy", "psychic"], "--strategy"),
        (["test", "scenario", "--machines", "5", "--hours", "0.1", "--oracle"], "bounded to 4 machines"),
        (["test", "scenario", "--hours", "25"], "--hours"),
        (["test", "scenario", "--models", "12", "--hours", "0.1"], "--models"),
    ]
    for args, message in cases:
        res = runner.invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        assert message in res.output, (args, res.output)


def test_graduate_prints_gates_and_exit_code_follows_them() -> None:
    res = runner.invoke(app, ["test", "graduate", "--fleets", "4", "--seeds", "1", "--hours", "0.5",
                              "--days", "classic", "--json"])
    assert res.exit_code in (0, 1), res.output
    body = json.loads(res.stdout)
    [fleet] = body["fleets"]
    assert fleet["day"] == "classic" and fleet["minutes"] == 30
    gates = fleet["gates"]
    assert {g["name"] for g in gates} >= {"zero smart safety violations", "smart serves more than static",
                                          "smart churn <= 0.5x min-residency-fenced greedy",
                                          "identical demand traces"}
    assert (res.exit_code == 0) == body["passed"] == all(g["passed"] for g in gates)


def test_graduate_takes_explicit_seeds_as_well_as_a_count() -> None:
    res = runner.invoke(app, ["test", "graduate", "--fleets", "2", "--seeds", "9,", "--hours", "0.25",
                              "--days", "classic", "--json"])
    assert res.exit_code in (0, 1), res.output
    assert json.loads(res.stdout)["fleets"][0]["seeds"] == [9]
    for seeds, message in (("0", "count"), ("5-3", "backwards"), ("x", "--seeds")):
        res = runner.invoke(app, ["test", "graduate", "--seeds", seeds])
        assert res.exit_code == 2 and message in res.output, (seeds, res.output)
    res = runner.invoke(app, ["test", "graduate", "--days", "weekend"])
    assert res.exit_code == 2 and "--days" in res.output, res.output


def test_graduate_json_is_byte_stable_and_a_count_equals_its_explicit_seeds() -> None:
    base = ["test", "graduate", "--fleets", "2", "--hours", "0.25", "--days", "classic", "--json"]
    a = runner.invoke(app, base + ["--seeds", "2"])
    b = runner.invoke(app, base + ["--seeds", "1,2"])
    assert a.exit_code in (0, 1), a.output
    assert a.stdout_bytes == b.stdout_bytes


def test_graduate_runs_with_flap_quarantine_on_or_off_and_an_ordinary_day_never_trips_it() -> None:
    base = ["test", "graduate", "--fleets", "2", "--seeds", "1", "--hours", "0.1", "--days", "classic", "--json"]
    on = runner.invoke(app, base)
    off = runner.invoke(app, base + ["--no-flap-quarantine"])
    assert on.exit_code in (0, 1) and off.exit_code in (0, 1), (on.output, off.output)
    assert on.stdout_bytes == off.stdout_bytes
    assert json.loads(on.stdout)["fleets"][0]["minutes"] == 6
