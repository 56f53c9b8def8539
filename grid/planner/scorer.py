"""What a scorer is: one measure (0..100) of a host as the place for one more replica of a model,
and whether that measure is class-wide or per host.

Why the ledger scores classes of hosts. Every replica a plan places is a search over the fleet,
and at fleet scale scoring every host for every search would cost more than the rest of the
planner. Most hosts hold nothing specific to a given model (no residency, cached weights,
measurement, learned timing or pending command of it, and no explicit host list naming them);
those are its plain hosts, and the rest its special hosts (``compile._special_hosts``). Hosts
fall into classes, hosts indistinguishable to every compatibility check and class-wide scorer
(``feasibility.HostClass``), and a class into buckets of equal load level and throttling. So on
a model's plain hosts:

- a class-wide scorer has one value per class: the ledger scores the class once per model;
- a per-host scorer that is constant within a bucket has one value per bucket;
- the two per-host scorers left, best fit and the new-failure-domain bonus, are what a bucket's
  search orders its hosts by (its open list is sorted by free memory, and a host in a new domain
  is looked for explicitly), so the first feasible host the search finds is the bucket's best.

A class's or a bucket's values with the best value of every per-host scorer still to be set (the
top of the scale for a bonus, 0 for a penalty) bound every member's total, and the search skips
classes and buckets that cannot beat the best host found so far. Special hosts and incumbents
are scored one host at a time with ``Scorer.on_host``, and the reference scan
(``Ledger(reference_scan=True)``) scores every host; tests prove the indexed and the reference
search make identical plans.

A scorer's type says its scope. A ``ClassScorer``'s ``on_host`` must equal its class value on
every plain host of the class; its ``on_class`` is None when it measures only what makes a host
special (it is then 0 on plain hosts). A ``HostScorer`` gives ``in_bucket`` when all hosts of a
bucket share its value; one that varies within a bucket is searched for by the ledger, which
knows how to search for best fit and the failure domain only: anything else that differs between
hosts of a bucket needs a class or bucket key of its own (``compile._hosts``) or makes those
hosts special for the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from grid.fleet.planning import TimingSample
from grid.fleet.views import ResidencyView
from grid.planner.feasibility import Bucket, HostClass
from grid.planner.state import HostState, ModelState


class ScoringContext(Protocol):
    """What scorers read of the plan being built (``ledger.Ledger`` is one)."""

    now: float
    # the largest new-work memory in the fleet: best fit's scale
    fit_scale: int
    # fleet-wide hardware maxima for the hardware prior
    max_bw: float
    max_gf: float
    timings: dict[tuple[str, str], TimingSample]
    # (host id, model id) of open load/warm commands
    pending: frozenset[tuple[str, str]]

    def cached(self, hs: HostState, ms: ModelState) -> bool: ...

    def scarcity(self, cls: HostClass, ms: ModelState) -> float: ...


# (plan, host, model, memory the replica would take, the live residency scored if it is one)
HostValue = Callable[[ScoringContext, HostState, ModelState, int, ResidencyView | None], float]
ClassValue = Callable[[ScoringContext, HostClass, ModelState], float]
BucketValue = Callable[[Bucket], float]

# Every scorer's values lie in 0..TOP.
TOP = 100.0


@dataclass(frozen=True, slots=True)
class Scorer:
    """One scorer: the name plans record it by, its weight and its value on one host."""

    name: str
    # Negative for a penalty.
    weight: float
    on_host: HostValue
    # Grows with offered concurrency (scoring.concurrency_boost).
    boosted: bool = False


@dataclass(frozen=True, slots=True)
class ClassScorer(Scorer):
    """Class-wide: the same value on every plain host of a class, scored once per class."""

    on_class: ClassValue | None = None


@dataclass(frozen=True, slots=True)
class HostScorer(Scorer):
    """Per host: scored for each host, or once per bucket when its hosts share the value."""

    in_bucket: BucketValue | None = None

    @property
    def best(self) -> float:
        """The value that adds the most to a total: the top for a bonus, 0 for a penalty."""
        return TOP if self.weight > 0 else 0.0
