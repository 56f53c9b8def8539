"""Candidate planners for replay tests, addressed as tests.unit.replay.planners:<name>.

Each wraps the installed planner, so a replay compares two real planners on recorded inputs.
"""

from __future__ import annotations

import msgspec

from grid.fleet.planning import Plan, PlannerInput
from grid.planner.plan import plan as installed


def without_first_host(pin: PlannerInput) -> Plan:
    """As if the first host did not exist: its placements move or become shortfalls."""
    return installed(msgspec.structs.replace(pin, hosts=pin.hosts[1:]))


def renamed_version(pin: PlannerInput) -> Plan:
    """The same decisions under another version string: equivalent, never byte-identical."""
    plan = installed(pin)
    return msgspec.structs.replace(plan, planner_version=plan.planner_version + "-candidate")


def broken(pin: PlannerInput) -> Plan:
    raise RuntimeError("candidate planner bug")


NOT_CALLABLE = 42
