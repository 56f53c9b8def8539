"""Invariant 7 for an external engine as the agent reports it: the planner counts it for its model,
and no plan/reconcile pass ever commands it, whatever the profile (wanting replicas, wanting
none, retired, absent) and whatever its host's state or the engine's probe verdict.

The residency is the agent's own heartbeat report (grid.agent.external), read back as the fleet
projection reads every heartbeat, so a change in how the agent reports it is covered too.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from grid.agent import external as ext
from grid.controller.reconcile import IGNORED_UNMANAGED
from grid.fleet.views import ResidencyView
from grid.planner.plan import plan as make_plan
from tests.unit.controller.ctlkit import NOW, History, host, observed, profile, profiles, reconcile_hosts

pytestmark = pytest.mark.unit

MODEL = "smol"


def external_view(ok: bool, kind: str = "llama.cpp") -> ResidencyView:
    """The agent's report of a registered engine, as the fleet projection sees it."""
    engines = ext.ExternalEngines(Path("/nonexistent"))
    reg = ext.validate(MODEL, "http://127.0.0.1:8080", kind, 1000, None)
    assert isinstance(reg, ext.Registration)
    verdict = ext.ProbeResult(ext.PROBE_OK) if ok else ext.ProbeResult(ext.PROBE_UNREACHABLE, "ConnectError")
    engines.update([(reg, verdict, None)], NOW - 600)
    (r,), _ = ext.reports(engines, NOW)
    return ResidencyView(model_id=r.model_id, memory_mb=r.memory_mb, state=r.state, managed=r.managed,
                         runtime=r.runtime, loaded_at=None if r.loaded_age_seconds is None else NOW - r.loaded_age_seconds,
                         endpoint=r.endpoint)


PROFILES = {
    "wants-one": profiles(profile(MODEL, min_replicas=1, max_replicas=1)),
    "wants-two": profiles(profile(MODEL, min_replicas=2, max_replicas=2)),
    "wants-none": profiles(profile(MODEL, min_replicas=0, max_replicas=1)),
    "absent": {},
}


@pytest.mark.parametrize(("profile_case", "host_state", "ok", "retired"), [
    (p, s, ok, retired)
    for p, s, ok, retired in itertools.product(sorted(PROFILES), ("accepting", "draining", "paused", "quarantined"),
                                               (True, False), (False, True))
    if not (retired and p != "absent")
])
def test_no_pass_ever_commands_the_external_engine(profile_case: str, host_state: str, ok: bool,
                                                   retired: bool) -> None:
    profs = PROFILES[profile_case]
    hosts = [host("h1", external_view(ok), state=host_state), host("h2")]
    retired_models = [MODEL] if retired else []
    plan = make_plan(observed(hosts, profs, retired=retired_models))
    result = reconcile_hosts(plan, hosts, History().state, profs, retired=retired_models)
    touched = [(a.kind, a.host_id) for a in result.actions if a.host_id == "h1"]
    assert touched == [], touched
    assert not [w for w in result.withdrawals if w.host_id == "h1"]
    assert not [p for p in plan.preemptions if p.host_id == "h1" and p.victim_model == MODEL]


@pytest.mark.parametrize("kind", ext.KINDS)
def test_a_ready_external_engine_counts_for_its_model_and_is_ignored_by_the_reconciler(kind: str) -> None:
    profs = PROFILES["wants-one"]
    hosts = [host("h1", external_view(True, kind)), host("h2")]
    plan = make_plan(observed(hosts, profs))
    mine = [(p.host_id, p.status, p.managed) for p in plan.placements if p.model_id == MODEL]
    # The external copy satisfies the one wanted replica: nothing new is placed for it.
    assert mine == [("h1", "existing", False)]
    result = reconcile_hosts(plan, hosts, History().state, profs)
    assert result.actions == () and result.satisfied == 1
    # Retired, the model's external copy is left alone (ignored), never drained.
    retired = reconcile_hosts(make_plan(observed(hosts, {}, retired=[MODEL])), hosts, History().state, {},
                              retired=[MODEL])
    assert retired.actions == ()
    assert [(i.host_id, i.reason) for i in retired.ignored] == [("h1", IGNORED_UNMANAGED)]


def test_a_failed_external_engine_does_not_count_so_a_managed_replica_is_placed_elsewhere() -> None:
    profs = PROFILES["wants-one"]
    hosts = [host("h1", external_view(False)), host("h2")]
    plan = make_plan(observed(hosts, profs))
    placed = [(p.host_id, p.managed) for p in plan.placements if p.model_id == MODEL and p.status != "existing"]
    assert placed and all(managed for _, managed in placed)
