"""The scorers a plan uses: one table, and everything the planner derives from it.

``SCORERS`` names each scorer, its weight, its scope (``scorer.py`` says what the scopes mean)
and what it reads of the plan. The score vector (``Scores``), the weights, the records plans
keep (``as_dict``) and the ledger's class, bucket and host values and bounds all come from it,
so a new scorer is one entry here (and, if it needs one, a measure in ``scoring.py``).
"""

from __future__ import annotations

import functools
import operator
from typing import NamedTuple

from grid.fleet.views import ResidencyView
from grid.planner import scoring as S
from grid.planner.feasibility import Bucket, HostClass
from grid.planner.scorer import ClassScorer, HostScorer, Scorer, ScoringContext
from grid.planner.state import HostState, ModelState


def _measured_tps(hs: HostState, ms: ModelState) -> float | None:
    return S.valid_tps(hs.snap.measured_tokens_per_second.get(ms.req.model_id))


def _resident(ctx: ScoringContext, hs: HostState, ms: ModelState, mem: int,
              incumbent: ResidencyView | None) -> float:
    return S.score_resident(incumbent.state if incumbent is not None else None)


def _cached(ctx: ScoringContext, hs: HostState, ms: ModelState, mem: int,
            incumbent: ResidencyView | None) -> float:
    return S.score_cached(ctx.cached(hs, ms))


def _domain(ctx: ScoringContext, hs: HostState, ms: ModelState, mem: int,
            incumbent: ResidencyView | None) -> float:
    return S.score_domain(hs.domain not in ms.used_domains)


def _throughput(ctx: ScoringContext, hs: HostState, ms: ModelState, mem: int,
                incumbent: ResidencyView | None) -> float:
    return S.score_throughput(_measured_tps(hs, ms), ms.max_tps)


def _hardware(ctx: ScoringContext, hs: HostState, ms: ModelState, mem: int,
              incumbent: ResidencyView | None) -> float:
    # A prior: a measurement of the model on this host replaces it (throughput).
    if _measured_tps(hs, ms) is not None:
        return 0.0
    res = hs.cls.resources
    return S.score_hardware(res.memory_bandwidth_gbps, res.compute_gflops, ctx.max_bw, ctx.max_gf)


def _hardware_of_class(ctx: ScoringContext, cls: HostClass, ms: ModelState) -> float:
    return cls.hw_score


def _fit(ctx: ScoringContext, hs: HostState, ms: ModelState, mem: int,
         incumbent: ResidencyView | None) -> float:
    return S.score_fit(hs.free_b, mem, ctx.fit_scale)


def _startup(ctx: ScoringContext, hs: HostState, ms: ModelState, mem: int,
             incumbent: ResidencyView | None) -> float:
    sample = ctx.timings.get((hs.host_id, ms.req.model_id))
    # A live residency has nothing left to load.
    loaded = ctx.cached(hs, ms) or incumbent is not None
    return S.score_startup(S.startup_seconds(ms.profile, sample, loaded, ms.req.sha))


def _startup_of_class(ctx: ScoringContext, cls: HostClass, ms: ModelState) -> float:
    return S.score_startup(S.startup_seconds(ms.profile, None, False, ms.req.sha))


def _sticky(ctx: ScoringContext, hs: HostState, ms: ModelState, mem: int,
            incumbent: ResidencyView | None) -> float:
    if incumbent is None:
        return S.score_sticky(False)
    if incumbent.loaded_at is None:
        return S.score_sticky(True)
    return S.score_sticky(ctx.now - incumbent.loaded_at < ms.profile.min_residency_seconds)


def _scarcity(ctx: ScoringContext, hs: HostState, ms: ModelState, mem: int,
              incumbent: ResidencyView | None) -> float:
    return ctx.scarcity(hs.cls, ms)


def _scarcity_of_class(ctx: ScoringContext, cls: HostClass, ms: ModelState) -> float:
    return ctx.scarcity(cls, ms)


def _load(ctx: ScoringContext, hs: HostState, ms: ModelState, mem: int,
          incumbent: ResidencyView | None) -> float:
    return S.score_load(hs.load_level)


def _load_of_bucket(b: Bucket) -> float:
    return S.score_load(b.load_level)


def _throttled(ctx: ScoringContext, hs: HostState, ms: ModelState, mem: int,
               incumbent: ResidencyView | None) -> float:
    return S.score_throttled(hs.throttled)


def _throttled_of_bucket(b: Bucket) -> float:
    return S.score_throttled(b.throttled)


def _failed(ctx: ScoringContext, hs: HostState, ms: ModelState, mem: int,
            incumbent: ResidencyView | None) -> float:
    existing = hs.residencies.get(ms.req.model_id)
    return S.score_failed(existing is not None and existing.state == "failed" and incumbent is None)


def _pending(ctx: ScoringContext, hs: HostState, ms: ModelState, mem: int,
             incumbent: ResidencyView | None) -> float:
    return S.score_pending(incumbent is None and (hs.host_id, ms.req.model_id) in ctx.pending)


# Order matters only for the floating-point sum: totals are always added in this order.
SCORERS: tuple[Scorer, ...] = (
    # existing ready (or warming/loading) residency of this model
    ClassScorer("resident", 400.0, _resident),
    # exact cached weights: no transfer, no disk cost
    ClassScorer("cached", 150.0, _cached),
    # a failure domain this model does not use yet
    HostScorer("domain", 120.0, _domain),
    # measured tokens/s for this model on this host
    ClassScorer("throughput", 40.0, _throughput, boosted=True),
    # memory bandwidth / compute prior when nothing is measured
    ClassScorer("hardware", 10.0, _hardware, boosted=True, on_class=_hardware_of_class),
    # best fit of the desired footprint
    HostScorer("fit", 25.0, _fit),
    # shorter learned (or configured) load + warm time
    ClassScorer("startup", 30.0, _startup, on_class=_startup_of_class),
    # incumbent still inside its minimum residency
    ClassScorer("sticky", 100.0, _sticky),
    # host is needed by a more constrained model of equal or higher priority
    ClassScorer("scarcity", -60.0, _scarcity, on_class=_scarcity_of_class),
    # current host load
    HostScorer("load", -30.0, _load, in_bucket=_load_of_bucket),
    # host is throttled
    HostScorer("throttled", -50.0, _throttled, in_bucket=_throttled_of_bucket),
    # a failed residency of this model sits on this host
    ClassScorer("failed", -200.0, _failed),
    # An open load/warm of this model already commanded here: the next plan keeps it over an
    # equal host instead of withdrawing it and starting over elsewhere (a tick is then a fixed
    # point of its own commands). Below a new failure domain and cached weights elsewhere.
    ClassScorer("pending", 100.0, _pending),
)
NAMES: tuple[str, ...] = tuple(s.name for s in SCORERS)
assert len(set(NAMES)) == len(NAMES), "one entry per scorer"

# One value per scorer, in table order. A tuple so that ``combine`` stays one multiply-add over
# two sequences in the hot path; the field names are what plans and explanations record.
Scores = NamedTuple("Scores", [(name, float) for name in NAMES])
# A NamedTuple's keyword constructor costs about three times as much as building the tuple.
_new_scores = tuple.__new__


@functools.lru_cache(maxsize=1024)
def weights_for(boost: float) -> tuple[float, ...]:
    return tuple(s.weight * boost if s.boosted else s.weight for s in SCORERS)


def combine(values: tuple[float, ...], boost: float) -> float:
    """Weighted total of scorer values (always summed in table order)."""
    return round(sum(map(operator.mul, weights_for(boost), values)), 6)


def as_dict(values: tuple[float, ...]) -> dict[str, float]:
    """The non-zero scores by scorer name, as a plan records them."""
    return {name: round(v, 3) for name, v in zip(NAMES, values, strict=True) if v != 0.0}


# ------------------------------------------------------------------------------------------
# Values by scope. A plain host's values are built from three parts, each scored as rarely as
# it can be: the class-wide scorers' (once per class and model), the per-host scorers shared by
# a bucket (once per bucket: they read nothing of the model) and the rest (once per host).
# ------------------------------------------------------------------------------------------
CLASS_WIDE: tuple[ClassScorer, ...] = tuple(s for s in SCORERS if isinstance(s, ClassScorer))
BUCKET_WIDE: tuple[HostScorer, ...] = tuple(
    s for s in SCORERS if isinstance(s, HostScorer) and s.in_bucket is not None
)
HOST_VARYING: tuple[HostScorer, ...] = tuple(
    s for s in SCORERS if isinstance(s, HostScorer) and s.in_bucket is None
)
# The class part puts the class-wide scorers that are 0 on every plain host last, as one
# constant: a class is scored once per model, but across thousands of classes and models.
_OF_CLASS = tuple(s for s in CLASS_WIDE if s.on_class is not None)
_ZERO_ON_PLAIN = tuple(s for s in CLASS_WIDE if s.on_class is None)
_PARTS: tuple[Scorer, ...] = (*_OF_CLASS, *_ZERO_ON_PLAIN, *BUCKET_WIDE, *HOST_VARYING)
assert len(_PARTS) == len(SCORERS), "every scorer is class-wide or per host"
# The parts concatenated, back in table order (and so summation order).
_table_order = operator.itemgetter(*(tuple(s.name for s in _PARTS).index(n) for n in NAMES))
_class_at = tuple(s.on_class for s in _OF_CLASS)
_zeros = tuple(0.0 for _ in _ZERO_ON_PLAIN)
_bucket_at = tuple(s.in_bucket for s in BUCKET_WIDE)
_varying_at = tuple(s.on_host for s in HOST_VARYING)
_per_host_at = tuple(s.on_host for s in (*BUCKET_WIDE, *HOST_VARYING))
_host_at = tuple(s.on_host for s in SCORERS)
_BUCKET_BEST = tuple(s.best for s in BUCKET_WIDE)
_VARYING_BEST = tuple(s.best for s in HOST_VARYING)


def _assemble(parts: tuple[float, ...]) -> Scores:
    return _new_scores(Scores, _table_order(parts))


def class_values(ctx: ScoringContext, cls: HostClass, ms: ModelState) -> tuple[float, ...]:
    """What every plain host of the class scores for ms on the class-wide scorers."""
    return tuple([f(ctx, cls, ms) for f in _class_at]) + _zeros


def bucket_values(bucket: Bucket) -> tuple[float, ...]:
    """What every host of the bucket scores on the per-host scorers it shares (for any model)."""
    return tuple([f(bucket) for f in _bucket_at])


def class_bound(class_part: tuple[float, ...]) -> Scores:
    """Values no plain host of the class can beat: every per-host scorer at its best."""
    return _assemble(class_part + _BUCKET_BEST + _VARYING_BEST)


def bucket_bound(shared: tuple[float, ...]) -> Scores:
    """Values no plain host of the bucket can beat (``shared``: its class's ``class_values``
    followed by its ``bucket_values``)."""
    return _assemble(shared + _VARYING_BEST)


def bucket_host_values(
    ctx: ScoringContext, hs: HostState, ms: ModelState, mem: int, shared: tuple[float, ...]
) -> Scores:
    """A plain host's values from what its bucket shares (as for ``bucket_bound``)."""
    return _assemble(shared + tuple([f(ctx, hs, ms, mem, None) for f in _varying_at]))


def plain_host_values(
    ctx: ScoringContext, hs: HostState, ms: ModelState, mem: int, class_part: tuple[float, ...]
) -> Scores:
    """A plain host's values from its class's (``class_values``), scored host by host."""
    return _assemble(class_part + tuple([f(ctx, hs, ms, mem, None) for f in _per_host_at]))


def host_values(
    ctx: ScoringContext,
    hs: HostState,
    ms: ModelState,
    mem: int,
    incumbent: ResidencyView | None,
) -> Scores:
    """Every scorer's value on one host, scored as itself (special hosts and incumbents)."""
    return _new_scores(Scores, [f(ctx, hs, ms, mem, incumbent) for f in _host_at])
