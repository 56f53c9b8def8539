"""Static eligibility: which hosts could ever take a model, memoised for one plan.

Static verdicts (host lifecycle, operator policy, compatibility, static capacity) do not change
while a plan is built, so they are computed once per (host class, requirement signature) or
per (host, model) and remembered here. The mutable ledgers build on this layer
(``grid.planner.ledger.Ledger``); dynamic checks live there.
"""

from __future__ import annotations

from bisect import bisect_left

from grid.planner.feasibility import (
    CHAIN,
    HostClass,
    ModelReq,
    Rejection,
    artifact_cached,
    matching_runtimes,
    runtime_memory,
)
from grid.planner.state import PlacementFleet, HostState, ModelState


class StaticEligibility:
    """Memoised static verdicts over one plan's hosts, host classes and models."""

    def __init__(
        self,
        hosts: list[HostState],
        classes: list[HostClass],
        fleet: PlacementFleet,
        models: list[ModelState],
    ) -> None:
        self.hosts = hosts
        self.classes = classes
        self.fleet = fleet
        self.models = models
        self.by_model: dict[str, ModelState] = {ms.req.model_id: ms for ms in models}
        self._compat_memo: dict[tuple[int, tuple], Rejection | None] = {}
        self._static_memo: dict[tuple[int, int], Rejection | None] = {}
        self._cached_memo: dict[tuple[int, int], bool] = {}
        self._domain_caps_memo: dict[int, dict[str, int]] = {}

    def compat(self, cls: HostClass, req: ModelReq) -> Rejection | None:
        key = (cls.idx, req.compat_key)
        try:
            return self._compat_memo[key]
        except KeyError:
            r = CHAIN.class_compat(cls, req)
            self._compat_memo[key] = r
            return r

    def class_verdict(self, cls: HostClass, ms: ModelState) -> Rejection | None:
        """Class-level static verdict for an uncached host (policy and memory excluded)."""
        if not cls.eligible:
            return (cls.lifecycle_reason or "", "")
        r = self.compat(cls, ms.req)
        if r is not None:
            return r
        return CHAIN.class_disk(cls, ms.req)

    def cached(self, hs: HostState, ms: ModelState) -> bool:
        if hs.idx not in ms.special_set:
            return False
        key = (hs.idx, ms.idx)
        v = self._cached_memo.get(key)
        if v is None:
            v = artifact_cached(hs.snap, ms.req)
            self._cached_memo[key] = v
        return v

    def host_static(self, hs: HostState, ms: ModelState) -> Rejection | None:
        """Full static chain for one host: lifecycle, policy, compatibility, static capacity."""
        key = (hs.idx, ms.idx)
        if key in self._static_memo:
            return self._static_memo[key]
        cls = hs.cls
        r = hs.lifecycle
        if r is None:
            r = CHAIN.host_policy(hs.host_id, ms.req)
        if r is None:
            r = self.compat(cls, ms.req)
        if r is None:
            _, mem = self.runtime_for(cls, ms)
            r = CHAIN.host_capacity(cls, hs.cap_new, mem, ms.req, self.cached(hs, ms))
        self._static_memo[key] = r
        return r

    def incumbent_charge(self, hs: HostState, ms: ModelState) -> int:
        """What a kept residency of ms is charged in the host's desired ledger: the memory its
        profile declares now, as a new replica there would be charged. The residency's own
        figure is what it was declared when it loaded; an operator who has since lowered (or
        raised) the declaration meant the new one, while ledger (a) goes on counting what the
        process was admitted with."""
        return self.runtime_for(hs.cls, ms)[1]

    def runtime_for(self, cls: HostClass, ms: ModelState) -> tuple[str, int]:
        rm = ms.class_mem.get(cls.idx)
        if rm is None:
            rm = runtime_memory(ms.req, matching_runtimes(cls, ms.req))
            assert rm is not None
        return rm

    def count_eligible(self) -> None:
        """Fill each model's ``class_mem`` and ``eligible_count`` (static, complete)."""
        # Group models by requirement signature: the class compatibility scan runs once each.
        passing: dict[tuple, list[HostClass]] = {}
        for ms in self.models:
            key = ms.req.compat_key
            lst = passing.get(key)
            if lst is None:
                lst = [
                    c
                    for c in self.classes
                    if c.eligible
                    and self.compat(c, ms.req) is None
                    and CHAIN.class_disk(c, ms.req) is None
                ]
                passing[key] = lst
            count = 0
            for cls in lst:
                rm = runtime_memory(ms.req, matching_runtimes(cls, ms.req))
                assert rm is not None
                ms.class_mem[cls.idx] = rm
                if not ms.explicit:
                    count += len(cls.caps) - bisect_left(cls.caps, rm[1])
            if not ms.explicit:
                for hid in sorted(ms.req.deny):
                    hs = self.fleet.by_id.get(hid)
                    if hs is not None and self.class_counts(hs, ms):
                        count -= 1
            for hi in ms.special:
                hs = self.hosts[hi]
                counted = (
                    (not ms.explicit)
                    and self.class_counts(hs, ms)
                    and hs.host_id not in ms.req.deny
                )
                if not counted and self.host_static(hs, ms) is None:
                    count += 1
            ms.eligible_count = count

    def class_counts(self, hs: HostState, ms: ModelState) -> bool:
        """Is this host counted as eligible by the class path (ignoring deny lists)?"""
        rm = ms.class_mem.get(hs.cls.idx)
        return hs.eligible and rm is not None and hs.cap_new >= rm[1]

    def eligible_domains(self, ms: ModelState, limit: int, exclude=()) -> set[str]:
        """Up to `limit` failure domains, not in `exclude`, that hold a statically eligible host."""
        out: set[str] = set()
        if limit <= 0:
            return out
        for hi in ms.special:
            hs = self.hosts[hi]
            if (
                hs.domain not in exclude
                and hs.domain not in out
                and self.host_static(hs, ms) is None
            ):
                out.add(hs.domain)
                if len(out) >= limit:
                    return out
        if ms.explicit:
            return out
        if ms.req.deny:
            for ci in sorted(ms.class_mem):
                mem = ms.class_mem[ci][1]
                for hi in self.classes[ci].hosts:
                    hs = self.hosts[hi]
                    if (
                        hs.domain in exclude
                        or hs.domain in out
                        or hs.cap_new < mem
                        or hs.host_id in ms.req.deny
                    ):
                        continue
                    out.add(hs.domain)
                    if len(out) >= limit:
                        return out
            return out
        for ci in sorted(ms.class_mem):
            cls = self.classes[ci]
            mem = ms.class_mem[ci][1]
            if cls.caps[-1] < mem:
                continue
            for d, cap in self._domain_caps(cls).items():
                if cap >= mem and d not in exclude and d not in out:
                    out.add(d)
                    if len(out) >= limit:
                        return out
        return out

    def _domain_caps(self, cls: HostClass) -> dict[str, int]:
        v = self._domain_caps_memo.get(cls.idx)
        if v is None:
            v = {}
            for hi in cls.hosts:
                hs = self.hosts[hi]
                if hs.cap_new > v.get(hs.domain, -1):
                    v[hs.domain] = hs.cap_new
            self._domain_caps_memo[cls.idx] = v
        return v
