"""Deterministic placement: one plan's steps over its ``Ledger`` (ledger.py).

``Placer.run()`` is the algorithm: each step is one method, called in order, and each method's
docstring gives that step's rules. Profiles and hosts are compiled into the ledger when the
placer is built (compile.py; per-model static eligibility is computed once per host class and
requirement signature).

``Placer(reference_scan=True)`` makes the ledger's candidate search a plain full scan; tests
use it to prove the indexed search gives the same plan.
"""

from __future__ import annotations

from grid.fleet import EVACUATING_HOST_STATES, INCUMBENT_STATES, PROCESS_STATES, RESIDENCY_STATE_RANK
from grid.fleet import reasons as R
from grid.fleet.planning import PlannerInput, Policy, Preemption
from grid.fleet.views import ResidencyView
from grid.planner import preemption, relocation, repair
from grid.planner.compile import compile_input
from grid.planner.devices import DeviceLedger, residency_devices
from grid.planner.feasibility import (
    DEFAULT_RUNTIMES,
    check_heartbeat_future,
    check_heartbeat_missing,
    check_heartbeat_stale,
    ModelReq,
)
from grid.planner.ledger import Ledger
from grid.planner.state import (
    TIER_REASON,
    TIERS,
    HostState,
    ModelState,
    MustMove,
    Slot,
)

# Managed residencies the placer may keep, per model: (host, residency).
Incumbents = dict[str, list[tuple[HostState, ResidencyView]]]
# Ready copies on operator-drained hosts: (model id, the must-move that evacuates it).
Evacuations = list[tuple[str, MustMove]]
# Per host, the residencies kept so far while seeding: (model id, its requirement if configured).
KeptOn = list[list[tuple[str, ModelReq | None]]]


class Placer:
    """One plan's placement over its ledger; ``run()`` is the algorithm."""

    def __init__(self, inp: PlannerInput, *, reference_scan: bool = False) -> None:
        self.inp = inp
        self.ledger: Ledger = compile_input(inp, reference_scan=reference_scan)
        self.models = self.ledger.models
        self.immovable: list[tuple[int, ResidencyView]] = []
        self.obsolete: list[tuple[int, ResidencyView]] = []

    def run(self) -> None:
        """Place every model: existing residencies first, then new replicas by priority."""
        self.take_live_inventory()
        self.keep_immovable_residencies()
        incumbents, evacuations = self.sort_managed_residencies()
        self.keep_incumbents(incumbents)
        self.evacuate_drained_hosts(evacuations)
        self.release_leaving_memory()
        self.reserve_pins()
        self.fill_priority_classes()
        self.retain_until_replaced()

    # ==================================================================================
    # Existing residencies
    # ==================================================================================
    def take_live_inventory(self) -> None:
        """Start each host's ledgers from its live inventory.

        One residency per model and host is the host's view of that model (a healthy copy
        before an unhealthy one). Immovable residencies (external or operator-pinned) and
        unmanaged memory consume both ledgers first; every live residency consumes ledger A.
        """
        led = self.ledger
        models = led.by_model
        self.immovable = []
        for hs in led.hosts:
            snap = hs.snap
            live: set[str] = set()
            live_mb = 0
            immovable_mb = 0
            seen: set[str] = set()
            for r in sorted(snap.residencies, key=_res_order):
                if r.model_id not in seen:
                    seen.add(r.model_id)
                    hs.residencies[r.model_id] = r
                elif (
                    r.state in INCUMBENT_STATES
                    and hs.residencies[r.model_id].state not in INCUMBENT_STATES
                ):
                    hs.residencies[r.model_id] = r
                if r.state not in PROCESS_STATES:
                    continue
                mem = max(0, int(r.memory_mb))
                live_mb += mem
                live.add(r.model_id)
                if not r.managed or r.pinned:
                    immovable_mb += mem
                    self.immovable.append((hs.idx, r))
            unmanaged = max(0, int(snap.unmanaged_memory_mb))
            hs.dev = DeviceLedger.for_host(snap, PROCESS_STATES)
            if hs.dev is not None:
                # Device memory in use by processes Grid does not own (the RAM figure says
                # nothing about device memory).
                unmanaged = hs.dev.foreign_mb
            hs.live_models = frozenset(live)
            hs.free_a = hs.cap_new - unmanaged - live_mb
            hs.free_b = hs.cap_new - unmanaged - immovable_mb
            for m in sorted(live):
                ms = models.get(m)
                if ms is not None:
                    hs._add_presence(ms.req.max_colocated, ms.req.excludes)
                else:
                    hs._add_presence(0, led.excl.get(m, frozenset()))

    def keep_immovable_residencies(self) -> None:
        """Immovable residencies satisfy demand when they are healthy, on an eligible host and
        statically compatible (they are never actuated either way)."""
        led = self.ledger
        models = led.by_model
        for hi, r in sorted(
            self.immovable, key=lambda t: (t[1].model_id, led.hosts[t[0]].host_id)
        ):
            ms = models.get(r.model_id)
            hs = led.hosts[hi]
            if (
                ms is None
                or r.state not in INCUMBENT_STATES
                or len(ms.entries) >= ms.wanted
            ):
                continue
            if led.host_static(hs, ms) is not None:
                continue
            if hs.residencies.get(r.model_id) is not r:
                continue
            slot = Slot(
                r.model_id,
                "immovable",
                max(0, int(r.memory_mb)),
                r.runtime,
                0,
                ms.priority,
                residency=r,
            )
            reason = R.PINNED_RESIDENCY if r.pinned else R.EXTERNAL_RESIDENCY
            led.keep(hs, r, ms, slot, reason)

    def sort_managed_residencies(self) -> tuple[Incumbents, Evacuations]:
        """Sort live managed residencies into incumbents (healthy, configured, on an eligible
        host), evacuations (ready copies on an operator-drained host) and obsolete ones
        (everything else, and duplicates of one model on one host)."""
        led = self.ledger
        models = led.by_model
        incumbents: Incumbents = {}
        evacuations: Evacuations = []
        self.obsolete = []
        for hs in led.hosts:
            for m, r in hs.residencies.items():
                if r.state not in PROCESS_STATES or not r.managed or r.pinned:
                    continue
                if r.state in INCUMBENT_STATES and m in models and hs.eligible:
                    incumbents.setdefault(m, []).append((hs, r))
                elif r.state == "ready" and m in models and _evacuating(hs, led.now, led.policy):
                    # An operator drain is a make-before-break evacuation: the ready copy must
                    # move, and retain_until_replaced keeps it desired until its replacement
                    # is ready (the reconciler ends that at the evacuation deadline).
                    evacuations.append((m, MustMove(hs.idx, r, R.HOST_NOT_ELIGIBLE_STATE, hs.snap.state)))
                else:
                    self.obsolete.append((hs.idx, r))
            for r in hs.snap.residencies:
                if (
                    r.managed
                    and not r.pinned
                    and r.state in PROCESS_STATES
                    and hs.residencies.get(r.model_id) is not r
                ):
                    self.obsolete.append((hs.idx, r))
        return incumbents, evacuations

    def keep_incumbents(self, incumbents: Incumbents) -> None:
        """Healthy incumbents that still satisfy every hard constraint keep their slot.

        Models go higher priority first, then more constrained first (fewer eligible hosts,
        larger memory). Within a model, an incumbent in a failure domain the spread still
        needs goes first, then the most useful state. An incumbent that no longer fits
        (capacity, policy, failure-domain spread) must move; one that breaks a lowered model
        ceiling or a tightened co-location rule is drained by a convergence preemption, within
        the plan's eviction budget. Incumbents beyond what a model wants are obsolete surplus.
        """
        led = self.ledger
        # Convergence checks compare an incumbent against the residencies already kept, not
        # against everything live; immovable residencies are kept from the start.
        kept_on: KeptOn = [[] for _ in led.hosts]
        kept_names: list[set[str]] = [set() for _ in led.hosts]
        for hi, r in self.immovable:
            if r.model_id not in kept_names[hi]:
                kept_names[hi].add(r.model_id)
                ms = led.by_model.get(r.model_id)
                kept_on[hi].append((r.model_id, ms.req if ms is not None else None))

        order = sorted(
            led.models,
            key=lambda ms: (
                -ms.priority,
                ms.eligible_count,
                -ms.profile.memory_mb,
                ms.req.model_id,
            ),
        )
        for ms in order:
            cands = sorted(
                incumbents.get(ms.req.model_id, ()), key=lambda t: t[0].host_id
            )
            remaining = list(cands)
            while remaining:
                if len(ms.entries) >= ms.wanted:
                    break
                short_domains = len(ms.used_domains) < ms.domain_target()
                used = ms.used_domains
                pick = min(
                    remaining,
                    key=lambda t, short=short_domains, used=used: (
                        0 if (short and t[0].domain not in used) else 1,
                        _state_key(t[1].state),
                        t[0].host_id,
                    ),
                )
                remaining.remove(pick)
                hs, r = pick
                verdict = self._incumbent_verdict(hs, r, ms, kept_on[hs.idx])
                if verdict is None and hs.domain in ms.used_domains:
                    # Keep room for the failure-domain spread that is still reachable.
                    more = led.eligible_domains(
                        ms, ms.domain_target(), exclude=ms.used_domains
                    )
                    target = min(ms.domain_target(), len(ms.used_domains) + len(more))
                    slots_left = ms.wanted - len(ms.entries) - 1
                    if slots_left < target - len(ms.used_domains):
                        verdict = (
                            "mustmove",
                            R.FAILURE_DOMAIN,
                            "spread needs another failure domain",
                            "",
                        )
                if verdict is None:
                    self._keep(hs, r, ms, kept_on)
                    continue
                kind, reason, detail, survivor = verdict
                if kind == "mustmove":
                    ms.mustmove.append(MustMove(hs.idx, r, reason, detail))
                elif led.evictions < led.policy.max_evictions:
                    self._converge(hs, r, ms, reason, survivor)
                else:
                    # Over this plan's eviction budget: the violation stays visible and
                    # converges over later plans instead of an unbounded wave.
                    ms.shortfalls.append(
                        (
                            R.EVICTION_BUDGET,
                            f"{reason} convergence on {hs.host_id} deferred",
                        )
                    )
                    self._keep(hs, r, ms, kept_on)
            for hs, r in remaining:
                self.obsolete.append((hs.idx, r))
                # Healthy and compliant, only beyond what is wanted: the model may take it back
                # if a staged preemption later removes one of its kept replicas.
                led.surplus.setdefault(ms.req.model_id, []).append((hs.idx, r))

    def evacuate_drained_hosts(self, evacuations: Evacuations) -> None:
        """Ready copies on operator-drained hosts must move (after the incumbents' own must-moves)."""
        for m, mm in evacuations:
            self.ledger.by_model[m].mustmove.append(mm)

    def release_leaving_memory(self) -> None:
        """Count the memory of obsolete residencies as leaving (the reconciler releases it on
        its own), index must-move incumbents by host, and reindex every host's free memory."""
        led = self.ledger
        for hi, r in self.obsolete:
            led.note_leaving(hi, r.model_id, max(0, int(r.memory_mb)))
        for ms in led.models:
            for mm in ms.mustmove:
                led.mustmove_on.setdefault(mm.hidx, []).append((ms, mm))
        for hs in led.hosts:
            led.fleet.reindex(hs)

    def _keep(self, hs: HostState, r: ResidencyView, ms: ModelState, kept_on: KeptOn) -> None:
        mem = self.ledger.incumbent_charge(hs, ms)
        slot = Slot(
            ms.req.model_id,
            "kept",
            mem,
            r.runtime,
            0,
            ms.priority,
            reason=R.INCUMBENT,
            residency=r,
        )
        # Scored before the ledger takes the memory (the fit is of the host as found).
        self.ledger.keep(hs, r, ms, slot, R.INCUMBENT)
        hs.free_b -= mem
        if hs.dev is not None:
            slot.devices = residency_devices(r, frozenset(hs.dev.indexes))
            hs.dev.take(slot.devices, mem, live=False)
        hs.add_desired(slot, ms.req)
        kept_on[hs.idx].append((ms.req.model_id, ms.req))

    def _incumbent_verdict(
        self,
        hs: HostState,
        r: ResidencyView,
        ms: ModelState,
        kept: list[tuple[str, ModelReq | None]],
    ) -> tuple[str, str, str, str] | None:
        """None (keep), ("mustmove", ...) or ("converge", ..., survivor model id)."""
        led = self.ledger
        req = ms.req
        rej = led.host_static(hs, ms)
        if rej is not None:
            return ("mustmove", rej[0], rej[1], "")
        allowed = req.runtimes or DEFAULT_RUNTIMES
        if r.runtime not in allowed or r.runtime not in hs.cls.runtime_set:
            return (
                "mustmove",
                R.RUNTIME_MISMATCH,
                f"live runtime {r.runtime} no longer allowed",
                "",
            )
        n = len(kept) + 1
        first = kept[0][0] if kept else ""
        if hs.limit and n > hs.limit:
            return (
                "converge",
                R.MODEL_LIMIT,
                f"host ceiling {hs.limit} below live inventory",
                first,
            )
        if req.max_colocated and n > req.max_colocated:
            return (
                "converge",
                R.COLOCATION_LIMIT,
                f"model allows {req.max_colocated} co-located",
                first,
            )
        for mid, k in kept:
            if mid in req.excludes:
                return (
                    "converge",
                    R.COLOCATION_EXCLUDED,
                    f"excluded pairing with {mid}",
                    mid,
                )
            if k is not None and k.max_colocated and n > k.max_colocated:
                return (
                    "converge",
                    R.COLOCATION_LIMIT,
                    f"{mid} allows {k.max_colocated} co-located",
                    mid,
                )
        mem = led.incumbent_charge(hs, ms)
        if mem > hs.free_b:
            return (
                "mustmove",
                R.INSUFFICIENT_MEMORY,
                f"desired footprint over capacity ({hs.free_b} MB free < {mem} MB)",
                "",
            )
        return None

    def _converge(
        self,
        hs: HostState,
        r: ResidencyView,
        ms: ModelState,
        reason: str,
        survivor: str,
    ) -> None:
        """Stage drain/unload of an incumbent that violates a lowered ceiling or co-location rule."""
        led = self.ledger
        self.obsolete.append((hs.idx, r))
        not_before = None
        if r.loaded_at is not None:
            t = r.loaded_at + ms.profile.min_residency_seconds
            if t > led.now:
                not_before = t
        led.evictions += 1
        rsn = (
            R.MODEL_LIMIT_CONVERGENCE
            if reason == R.MODEL_LIMIT
            else R.COLOCATION_CONVERGENCE
        )
        led.preemptions.append(
            Preemption(
                host_id=hs.host_id,
                victim_model=r.model_id,
                beneficiary_model=survivor,
                reason=rsn,
                memory_mb=max(0, int(r.memory_mb)),
                priority=led.by_model[survivor].priority
                if survivor in led.by_model
                else ms.priority,
                not_before=not_before,
            )
        )

    # ==================================================================================
    # New replicas
    # ==================================================================================
    def reserve_pins(self) -> None:
        """Hard pins are reserved first, on their exact hosts (higher priority first), with a
        destructive staged preemption when the pinned host is full."""
        led = self.ledger
        pinned = sorted(
            (ms for ms in led.models if ms.req.pins and ms.wanted > 0),
            key=lambda ms: (-ms.priority, ms.req.model_id),
        )
        for ms in pinned:
            mid = ms.req.model_id
            if mid in led.held_models:
                if ms.progress or ms.retained:
                    ms.shortfalls.append((R.FLAP_QUARANTINE, "model lifecycle flaps"))
                    continue
                # Its only replica, as in _place_one: on the first pin that takes it.
                led.held_models.discard(mid)
                try:
                    self._reserve_pins_of(ms, first_only=True)
                finally:
                    led.held_models.add(mid)
                continue
            self._reserve_pins_of(ms)

    def _reserve_pins_of(self, ms: ModelState, *, first_only: bool = False) -> None:
        """One model's pins; `first_only`: stop once one replica is reserved."""
        led = self.ledger
        for hid in ms.req.pins:
            if first_only and ms.progress:
                return
            hs = led.fleet.by_id.get(hid)
            if hs is None:
                ms.shortfalls.append(
                    (R.PIN_UNSATISFIED, f"{hid}: {R.UNKNOWN_HOST}")
                )
                continue
            if any(e.hidx == hs.idx for e in ms.entries):
                continue
            if hs.flap_quarantined:
                ms.shortfalls.append((R.PIN_UNSATISFIED, f"{hid}: {R.FLAP_QUARANTINE}"))
                continue
            rej = led.host_static(hs, ms)
            if rej is not None:
                ms.shortfalls.append(
                    (R.PIN_UNSATISFIED, f"{hid}: {rej[0]} {rej[1]}".strip())
                )
                continue
            c = led.eval_host(hs, ms, False)
            if c is not None:
                led.commit_new(ms, c, R.PIN, ms.priority, pinned_phase=True)
                continue
            outcome = preemption.stage(led, ms, only_host=hs, destructive=True)
            if outcome is None:
                r, _, _, _ = led.feasible(hs, ms)
                why = f"{r[0]} {r[1]}" if r else ""
                if led.evictions >= led.policy.max_evictions:
                    why = f"{R.EVICTION_BUDGET} ({why})"
                ms.shortfalls.append((R.PIN_UNSATISFIED, f"{hid}: {why}".strip()))

    def fill_priority_classes(self) -> None:
        """Priority classes fill from high to low.

        Within a class: baseline replicas, then direct demand, then inferred-only prewarms
        (the tiers), one replica per model per round (max-min fair) in the order: fewer
        eligible hosts, larger memory, greater attributable harm, model id. A model whose
        replica finds no place is blocked for the rest of the plan.
        """
        led = self.ledger
        classes = sorted(
            {ms.priority for ms in led.models if ms.wanted > 0}, reverse=True
        )
        for prio in classes:
            members = [
                ms for ms in led.models if ms.priority == prio and ms.wanted > 0
            ]
            members.sort(
                key=lambda ms: (
                    ms.eligible_count,
                    -ms.profile.memory_mb,
                    ms.harm_key,
                    ms.req.model_id,
                )
            )
            for tier in TIERS:
                active = [
                    ms
                    for ms in members
                    if not ms.blocked
                    and ms.progress < ms.wanted
                    and ms.tier_of(ms.progress) == tier
                ]
                while active:
                    nxt = []
                    for ms in active:
                        if self._place_one(ms, tier, prio):
                            if (
                                ms.progress < ms.wanted
                                and ms.tier_of(ms.progress) == tier
                            ):
                                nxt.append(ms)
                        else:
                            ms.blocked = True
                    active = nxt

    def _place_one(self, ms: ModelState, tier: str, prio: int) -> bool:
        led = self.ledger
        mid = ms.req.model_id
        lifted = False
        if mid in led.held_models:
            if ms.progress or ms.retained:
                # Flap quarantine: no further replica, no preemption or relocation on its behalf
                # (the shortfall's dynamic rejections name the quarantine).
                return False
            # A held model with no replica at all still gets one: quarantine slows a crash loop
            # down to one replica at a time, it never leaves demand with nothing to serve it.
            led.held_models.discard(mid)
            lifted = True
        if led.new_count >= led.policy.max_new_placements:
            ms.placement_budget = True
            if lifted:
                led.held_models.add(mid)
            return False
        # A predictive (inferred-only) transfer must leave the larger predictive disk reserve.
        led.disk_extra = led.predictive_extra if tier == "inferred" else 0
        try:
            return self._place_one_inner(ms, tier, prio)
        finally:
            led.disk_extra = 0
            if lifted:
                led.held_models.add(mid)

    def _place_one_inner(self, ms: ModelState, tier: str, prio: int) -> bool:
        """The best free host; else bounded repair (repair.py); else staged preemption
        (preemption.py; never destructive for inferred-only demand); else a make-before-break
        relocation of an incumbent that stands in the way (relocation.py)."""
        led = self.ledger
        c = led.choose(ms)
        if c is not None:
            led.commit_new(ms, c, TIER_REASON[tier], prio)
            return True
        if repair.try_repair(led, ms, tier, prio):
            return True
        if self.place_last_resort(ms, tier, prio):
            return True
        outcome = preemption.stage(
            led, ms, only_host=None, destructive=tier != "inferred"
        )
        if outcome is not None:
            return True
        return relocation.stage(led, ms, prio)

    def place_last_resort(self, ms: ModelState, tier: str, prio: int) -> bool:
        """A replica no other host can take may go to a flap-quarantined host: its uptime is
        better than no replica, and quarantine must never cost service. Nothing is preempted or
        relocated on a quarantined host (preemption.py, relocation.py skip it)."""
        led = self.ledger
        held = [hs for hs in led.hosts if hs.flap_quarantined]
        if not held:
            return False
        for hs in held:
            hs.flap_quarantined = False
        try:
            c = led.choose(ms)
        finally:
            for hs in held:
                hs.flap_quarantined = True
        if c is None:
            return False
        led.commit_new(ms, c, TIER_REASON[tier], prio)
        return True

    def retain_until_replaced(self) -> None:
        """Make-before-break: a ready must-move incumbent stays in the desired set while the
        model would otherwise have fewer ready replicas than wanted."""
        led = self.ledger
        for ms in led.models:
            if ms.wanted <= 0 or not ms.mustmove:
                continue
            ready = sum(
                1
                for e in ms.entries
                if e.status == "existing"
                and e.slot.residency is not None
                and e.slot.residency.state == "ready"
            )
            deficit = ms.wanted - ready
            if deficit <= 0:
                continue
            for mm in sorted(ms.mustmove, key=lambda mm: led.hosts[mm.hidx].host_id):
                if deficit <= 0:
                    break
                if mm.preempted or mm.residency.state != "ready":
                    continue
                ms.retained.append(mm)
                deficit -= 1


def _evacuating(hs: HostState, now: float, policy: Policy) -> bool:
    """An operator-drained host whose only lifecycle problem is that state: its heartbeat is
    neither missing, stale nor implausibly in the future (the state check comes first in the
    lifecycle chain, so the later checks are run here)."""
    snap = hs.snap
    return (
        snap.state in EVACUATING_HOST_STATES
        and hs.lifecycle is not None
        and hs.lifecycle[0] == R.HOST_NOT_ELIGIBLE_STATE
        and check_heartbeat_missing(snap, now, policy) is None
        and check_heartbeat_stale(snap, now, policy) is None
        and check_heartbeat_future(snap, now, policy) is None
    )


def _state_key(state: str) -> int:
    """Healthy residencies first, most useful first (grid.fleet's rank: ready, warming,
    loading); every other state ties (placement never prefers one unhealthy copy to another;
    callers break the tie on the state name)."""
    return -RESIDENCY_STATE_RANK[state] if state in INCUMBENT_STATES else 0


def _res_order(r: ResidencyView) -> tuple:
    return (
        r.model_id,
        0 if r.state in INCUMBENT_STATES else 1,
        _state_key(r.state),
        r.state,
    )

