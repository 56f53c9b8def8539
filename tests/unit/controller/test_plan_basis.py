"""The plan's basis: what the reconciler decides from, complete where explanations are bounded."""

from __future__ import annotations

from grid.controller.reconcile import DRAIN_OBSOLETE, DRAIN_SCALE_DOWN, reconcile
from grid.fleet.planning import PlannerInput, Policy
from grid.planner.plan import plan
from grid.projections import actions as actions_proj

from tests.unit.controller.ctlkit import NOW, host, profile, res

HOSTS = tuple(host(f"h{i}", res("m")) for i in range(6)) + (host("small", res("m"), capacity=500),)


def _input(limit: int) -> PlannerInput:
    # Seven managed copies of `m`, one wanted; "small" can no longer hold it (insufficient memory).
    return PlannerInput(now=NOW, profiles=(profile("m", min_replicas=1, max_replicas=1),), hosts=HOSTS,
                        policy=Policy(explain_host_limit=limit))


def test_eligible_holders_match_a_complete_explanation() -> None:
    p = plan(_input(64))
    [ex], [basis] = p.explanations, p.basis
    assert ex.eligible_count == len(ex.eligible_hosts)  # complete
    assert basis.eligible_holders == tuple(h for h in sorted(h.host_id for h in HOSTS) if h in ex.eligible_hosts)
    assert "small" not in basis.eligible_holders and basis.evidence == ex.evidence == "baseline"


def test_the_basis_stays_complete_when_explanations_are_bounded() -> None:
    bounded, full = plan(_input(1)), plan(_input(64))
    assert len(bounded.explanations[0].eligible_hosts) == 1
    assert bounded.basis == full.basis


def test_a_copy_on_a_host_that_still_fits_is_a_scale_down_elsewhere_a_move() -> None:
    pin = _input(1)  # the explanation lists one eligible host: the decision must not depend on it
    p = plan(pin)
    assert [pl.host_id for pl in p.placements] == ["h0"]
    result = reconcile(p, pin, actions_proj.initial(), NOW, mode="automatic")
    assert {(a.kind, a.host_id): a.reason for a in result.actions} == {
        **{("drain", f"h{i}"): DRAIN_SCALE_DOWN for i in range(1, 6)}, ("drain", "small"): DRAIN_OBSOLETE,
    }
