"""Mutable per-plan state: per host the two memory ledgers, model slots, co-location and the
disk ledger; per model its desired entries, must-move residencies and progress
(``ModelState``). ``ledger.Ledger`` is the one owner that changes them.

Ledger (a), ``free_a``: incremental make-before-break capacity. Every live process on the host
(managed or not, desired or obsolete) plus unmanaged memory plus this plan's new placements is
subtracted from the new-work allocatable memory; a new allocation needs
``memory * (1 + admission_headroom_fraction)`` of it.

Ledger (b), ``free_b``: the complete desired footprint. Unmanaged memory and immovable
residencies (external or operator-pinned) consume it first, then kept incumbents, new
placements and staged-preemption reservations. A new placement needs ``memory`` of it.

Both ledgers are bounded by the new-work allocatable memory (raw allocatable after reserve and
thermal derating; a throttled host offers only its throttle fraction).

Hosts that can still take new work are kept in their bucket's ``open`` list (a bucket is a host
class plus load level and throttling), sorted by ``(free_b, host_id)``: within a bucket every
scorer except best fit (and the failure-domain bonus) is constant, so the first feasible host
from ``bisect(memory)`` is the bucket's best candidate.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from dataclasses import dataclass, field

from grid.events.control import ModelProfile
from grid.fleet import reasons as R
from grid.fleet.planning import DemandTarget
from grid.fleet.views import HostView, ResidencyView
from grid.planner.devices import DeviceLedger
from grid.planner.feasibility import Bucket, HostClass, ModelReq, Rejection

# Within a priority class, replicas fill in this order; each tier's new replicas carry its reason.
TIERS: tuple[str, ...] = ("baseline", "direct", "inferred")
TIER_REASON = {"baseline": R.BASELINE, "direct": R.DIRECT, "inferred": R.INFERRED}


@dataclass(slots=True, eq=False)
class Slot:
    """One desired (or reserved) model on a host."""

    model_id: str
    kind: str  # kept | new | reserved
    memory_mb: int
    runtime: str
    disk_bytes: int = 0
    priority: int = 0
    reason: str = ""
    residency: ResidencyView | None = None
    round_class: int = 0  # priority class that created a new placement (repair scope)
    pinned_phase: bool = False
    # Device indexes charged for it on a VRAM host (devices.DeviceLedger); empty elsewhere.
    devices: tuple[int, ...] = ()


class HostState:
    __slots__ = (
        "bucket",
        "cap_new",
        "cls",
        "col_counts",
        "dev",
        "col_min",
        "desired",
        "disk_budget",
        "disk_used",
        "domain",
        "eligible",
        "excl_counts",
        "free_a",
        "free_b",
        "held_models",
        "host_id",
        "idx",
        "leaving_mb",
        "lifecycle",
        "limit",
        "live_models",
        "load_level",
        "okey",
        "present_n",
        "flap_quarantined",
        "residencies",
        "snap",
        "throttled",
    )

    def __init__(
        self,
        idx: int,
        snap: HostView,
        cls: HostClass,
        bucket: Bucket | None,
        lifecycle: Rejection | None,
        cap_new: int,
        load_level: int,
        disk_reserve: int,
    ) -> None:
        self.idx = idx
        self.host_id = snap.host_id
        self.snap = snap
        self.cls = cls
        self.bucket = bucket
        self.domain = snap.resources.failure_domain
        self.lifecycle = lifecycle
        self.eligible = lifecycle is None
        # Flap quarantine (grid.fleet.quarantine): the host takes a new replica only as the last
        # resort (Placer.place_last_resort) and keeps its incumbents; `held_models` (one set
        # shared by every host and the ledger) take no new replica anywhere, except a model's
        # only one (Placer._place_one).
        self.flap_quarantined = False
        self.held_models: set[str] = set()
        self.cap_new = cap_new
        self.load_level = load_level
        self.throttled = snap.state == "throttled"
        self.free_a = cap_new
        self.free_b = cap_new
        self.live_models: frozenset[str] = frozenset()
        self.desired: dict[str, Slot] = {}
        self.present_n = 0
        self.limit = max(0, int(snap.resources.model_limit))
        self.col_counts: Counter[int] = Counter()
        self.col_min = 0
        self.excl_counts: Counter[str] = Counter()
        if snap.disk_free_bytes is None:
            self.disk_budget: int | None = None
        else:
            self.disk_budget = int(snap.disk_free_bytes) - int(disk_reserve)
        self.disk_used = 0
        self.okey: tuple[int, str, int] | None = None
        # model id -> first residency of that model on this host (sorted input order)
        self.residencies: dict[str, ResidencyView] = {}
        # Memory of obsolete live residencies (released by the reconciler on its own).
        self.leaving_mb = 0
        # Per-device ledgers when this host's placements live in discrete GPU memory.
        self.dev: DeviceLedger | None = None

    # -- presence (live models plus desired models) -------------------------------------
    def _add_presence(self, max_colocated: int, excludes: frozenset[str]) -> None:
        """A model became present. ``excludes`` is the symmetric exclusion set of that model
        id (also for live models without a profile: another profile may exclude them)."""
        self.present_n += 1
        if max_colocated:
            self.col_counts[max_colocated] += 1
            self.col_min = min(self.col_counts)
        for x in excludes:
            self.excl_counts[x] += 1

    def _remove_presence(self, max_colocated: int, excludes: frozenset[str]) -> None:
        self.present_n -= 1
        if max_colocated:
            self.col_counts[max_colocated] -= 1
            if self.col_counts[max_colocated] <= 0:
                del self.col_counts[max_colocated]
            self.col_min = min(self.col_counts) if self.col_counts else 0
        for x in excludes:
            self.excl_counts[x] -= 1
            if self.excl_counts[x] <= 0:
                del self.excl_counts[x]

    def add_desired(self, slot: Slot, req: ModelReq) -> None:
        assert slot.model_id not in self.desired
        self.desired[slot.model_id] = slot
        if slot.model_id not in self.live_models:
            self._add_presence(req.max_colocated, req.excludes)

    def remove_desired(self, model_id: str, req: ModelReq) -> Slot:
        slot = self.desired.pop(model_id)
        if model_id not in self.live_models:
            self._remove_presence(req.max_colocated, req.excludes)
        return slot

    def is_open(self) -> bool:
        """Can this host take any new work at all?"""
        if not self.eligible or self.free_a <= 0 or self.free_b <= 0:
            return False
        if self.limit and self.present_n >= self.limit:
            return False
        return not (self.col_min and self.present_n >= self.col_min)

    def present(self, model_id: str) -> bool:
        return model_id in self.desired or model_id in self.live_models


@dataclass(slots=True, eq=False)
class Totals:
    """Aggregate free capacity for the repair lower bound (eligible hosts only)."""

    free_mb: int = 0
    slots: int = 0  # free model slots on hosts with a model limit
    unlimited_open: int = 0  # open hosts with no model limit
    contrib: dict[int, tuple[int, int, int]] = field(default_factory=dict)


def host_contribution(hs: HostState) -> tuple[int, int, int]:
    """(free memory, free model slots under a host ceiling, 1 if open without a ceiling).

    Co-location limits are model-specific and can disappear when a replica moves, so only the
    host's own model ceiling bounds slots here (keeps the repair bound admissible)."""
    if not hs.eligible:
        return (0, 0, 0)
    free = max(0, min(hs.free_a, hs.free_b))
    if hs.limit:
        return (free, max(0, hs.limit - hs.present_n), 0)
    return (free, 0, 1 if free > 0 else 0)


class PlacementFleet:
    """Host states, class index and aggregate totals."""

    def __init__(self, hosts: list[HostState], classes: list[HostClass]) -> None:
        self.hosts = hosts
        self.by_id = {h.host_id: h for h in hosts}
        self.classes = classes
        self.totals = Totals()

    def reindex(self, hs: HostState) -> None:
        b = hs.bucket
        if b is not None:
            if hs.okey is not None:
                i = bisect_left(b.open, hs.okey)
                assert b.open[i] == hs.okey
                del b.open[i]
                hs.okey = None
            if hs.is_open():
                hs.okey = (hs.free_b, hs.host_id, hs.idx)
                insort(b.open, hs.okey)
        t = self.totals
        old = t.contrib.get(hs.idx, (0, 0, 0))
        new = host_contribution(hs)
        if old != new:
            t.free_mb += new[0] - old[0]
            t.slots += new[1] - old[1]
            t.unlimited_open += new[2] - old[2]
            t.contrib[hs.idx] = new


# ------------------------------------------------------------------------------------------
# Per-model state
# ------------------------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class ScoredHost:
    """A feasible host for one more replica of a model, with its scores."""

    score: float
    host_id: str
    hidx: int
    runtime: str
    memory_mb: int
    disk_bytes: int
    values: tuple[float, ...]  # a scorers.Scores (that module reads the types declared here)

    def beats(self, other: ScoredHost | None) -> bool:
        if other is None:
            return True
        if self.score != other.score:
            return self.score > other.score
        return self.host_id < other.host_id


@dataclass(slots=True, eq=False)
class MustMove:
    """A live managed residency that no longer satisfies a hard constraint."""

    hidx: int
    residency: ResidencyView
    reason: str
    detail: str
    preempted: bool = False


@dataclass(slots=True, eq=False)
class Entry:
    """A compliant desired replica of a model (kept, immovable or new)."""

    hidx: int
    slot: Slot
    status: str  # existing | new
    reason: str
    managed: bool
    values: tuple[float, ...]  # a scorers.Scores (that module reads the types declared here)
    score: float


@dataclass(slots=True, eq=False)
class ModelState:
    idx: int
    req: ModelReq
    profile: ModelProfile
    priority: int
    retired: bool
    wanted: int
    n_base: int
    tail_evidence: str
    evidence_label: str
    demand: DemandTarget | None
    harm_key: tuple[float, ...]
    boost: float
    # static eligibility
    class_mem: dict[int, tuple[str, int]] = field(default_factory=dict)
    class_order: list[tuple[float, int]] = field(default_factory=list)
    special: tuple[int, ...] = ()
    special_set: frozenset[int] = frozenset()
    explicit: bool = False
    eligible_count: int = 0
    max_tps: float = 0.0
    # dynamic
    entries: list[Entry] = field(default_factory=list)
    staged: int = 0  # replicas waiting for a staged preemption (victims drain first)
    # replicas waiting for obsolete residencies that are already leaving
    awaiting: int = 0
    # replicas waiting for an incumbent of another model to move off their host (relocation.py)
    relocating: int = 0
    staged_hosts: list[str] = field(default_factory=list)
    used_domains: Counter = field(default_factory=Counter)
    mustmove: list[MustMove] = field(default_factory=list)
    retained: list[MustMove] = field(default_factory=list)
    blocked: bool = False
    shortfalls: list[tuple[str, str]] = field(default_factory=list)
    # a preemption was possible but policy.max_evictions was reached
    budget_blocked: bool = False
    placement_budget: bool = False  # policy.max_new_placements was reached

    @property
    def progress(self) -> int:
        return len(self.entries) + self.staged + self.awaiting + self.relocating

    def tier_of(self, index: int) -> str:
        return "baseline" if index < self.n_base else self.tail_evidence

    def domain_target(self) -> int:
        return max(0, min(int(self.profile.min_failure_domains), self.wanted))


def min_memory(profile: ModelProfile) -> int:
    """Smallest footprint any runtime could give this model (repair lower bound)."""
    vals = [int(profile.memory_mb)] + [
        int(v) for v in profile.runtime_memory_mb.values()
    ]
    return max(0, min(vals))
