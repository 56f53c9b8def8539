"""The lab's flapping-host scenario: with flap quarantine the flapping machine is given fewer
replicas to lose, and the day serves as much as without it, with no safety violation."""

from __future__ import annotations

import json

from grid.sim import flapping
from grid.sim.scenario import ScenarioConfig, prepare
from grid.sim.workday import OUTAGE


def test_the_flapping_day_replaces_the_machines_outage_with_a_series():
    sc = prepare(ScenarioConfig(machines=8, minutes=120, seed=1))
    fsc, host = flapping.flapping_scenario(sc)
    assert host == min(sc.fleet, key=lambda m: (-m.memory_mb, m.host_id)).host_id  # the largest
    series = [i for i in fsc.day.incidents if i.kind == OUTAGE and i.host_id == host]
    assert [(i.start, i.end) for i in series] == [(m, m + 2) for m in range(30, 90, 6)]
    assert fsc.requests == sc.requests  # the same trace: only the machine's incidents differ


def test_ordinary_days_stay_below_the_host_threshold_and_the_flapping_host_exceeds_it():
    sc = prepare(ScenarioConfig(machines=4, minutes=60, users=20, seed=1))
    fsc, host = flapping.flapping_scenario(sc)
    policy = flapping.Policy()
    ordinary = flapping.transition_peaks(sc, policy.flap_window_seconds)
    flapped = flapping.transition_peaks(fsc, policy.flap_window_seconds)
    assert max(ordinary.values()) < policy.flap_host_transitions <= flapped[host]


def test_quarantine_gives_the_flapping_host_fewer_replicas_to_lose_without_losing_service():
    sc = prepare(ScenarioConfig(machines=8, minutes=120, seed=1))
    on, off = flapping.compare(sc)
    assert on.quarantined_minutes > 0 and off.quarantined_minutes == 0
    assert on.starts_on_flapping_host < off.starts_on_flapping_host
    assert on.replicas_lost < off.replicas_lost
    assert on.churn <= off.churn
    assert on.served_demand >= off.served_demand
    assert on.least_workload_service >= off.least_workload_service
    assert on.safety_violations == 0 and off.safety_violations == 0


def test_quarantine_costs_no_service_where_the_flapping_host_is_half_the_fleet():
    # Four machines, the flapping one holding half the memory: holding it out of new placement
    # left models short (served 0.653 against 0.687 without quarantine); a plan that host
    # quarantine would cost a replica is now made without it.
    on, off = flapping.compare(prepare(ScenarioConfig(machines=4, minutes=120, seed=2)))
    assert on.quarantined_minutes > 0
    assert on.served_demand >= off.served_demand
    assert on.least_workload_service >= off.least_workload_service
    assert on.safety_violations == 0


def test_gridctl_test_flapping_prints_both_runs_and_refuses_a_zero_cycle():
    from typer.testing import CliRunner

    from grid.cli.main import app

    runner = CliRunner()
    base = ["test", "flapping", "--machines", "4", "--users", "15", "--hours", "0.5", "--seed", "5"]
    out = runner.invoke(app, base + ["--json"])
    assert out.exit_code == 0, out.output
    body = json.loads(out.stdout)
    assert body["quarantine_on"]["quarantine"] is True and body["quarantine_off"]["quarantine"] is False
    assert body["quarantine_off"]["quarantined_minutes"] == 0
    table = runner.invoke(app, base)
    assert table.exit_code == 0 and "quarantine on" in table.output and "replicas it lost" in table.output
    bad = runner.invoke(app, base + ["--down", "0"])
    assert bad.exit_code == 2
