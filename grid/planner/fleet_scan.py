"""Fleet feasibility scan: which models some known host could ever hold (pure).

The forecast's portfolio choice reads this before projecting `auto` demand onto a model, so an
attractive model that no host can run never suppresses a usable fallback (seed: "an attractive
model that no live node can host is excluded instead of suppressing a usable fallback").

It applies placement's own immutable checks, through the same FeasibilityChain: operator
placement policy (deny, allow, pins), compatibility (data tier, runtime, backend, tags, GPU
shape) and static memory (the largest matching runtime estimate against the host's raw
allocatable memory after reserve and thermal derating). Lifecycle (stale, paused, an outage)
and live occupancy are deliberately left out: they pass, and a temporary outage must not flip
the workload-to-model map back and forth.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from grid.events.control import ModelProfile
from grid.fleet.qualification import qualified_hosts
from grid.fleet.views import raw_allocatable_mb
from grid.fleet.views import HostView
from grid.planner.feasibility import (
    FeasibilityChain,
    HostClass,
    ModelReq,
    matching_runtimes,
    runtime_memory,
    tier_index,
)


def _host_class(i: int, host: HostView) -> HostClass:
    res = host.resources
    ti = tier_index(res.data_tier)
    return HostClass(
        idx=i, key=(host.host_id,), resources=res, eligible=True, lifecycle_reason=None, hw_score=0.0,
        disk_known=host.disk_free_bytes is not None, runtime_set=frozenset(res.runtimes),
        backend_set=frozenset(res.backends), tag_set=frozenset(res.tags), tier=-1 if ti is None else ti,
    )


def placeable_models(profiles: Iterable[ModelProfile], hosts: Sequence[HostView]) -> frozenset[str]:
    """Model ids with at least one host that passes every immutable placement check."""
    chain = FeasibilityChain()
    # A host's class and raw memory are built on first need: a model usually finds its host
    # among the first few, so building all of them up front (10,000 at 10,000 hosts) was most of
    # this scan's cost. Hosts are still tried in the same order with the same checks.
    facts: dict[int, tuple[HostClass, int]] = {}

    def host_facts(i: int) -> tuple[HostClass, int]:
        known = facts.get(i)
        if known is None:
            known = facts[i] = (_host_class(i, hosts[i]), raw_allocatable_mb(hosts[i].resources))
        return known

    out: set[str] = set()
    for profile in profiles:
        req = ModelReq.compile(profile, frozenset(), qualified_hosts(profile, hosts))
        for i, host in enumerate(hosts):
            if chain.host_policy(host.host_id, req) is not None:
                continue
            cls, raw = host_facts(i)
            if chain.class_compat(cls, req) is not None:
                continue
            rm = runtime_memory(req, matching_runtimes(cls, req))
            if rm is not None and rm[1] <= raw:
                out.add(profile.model_id)
                break
    return frozenset(out)
