"""Model-level demand correlation: co-activation groups and one-bucket directional pairs.

Over the complete buckets of the demand window (the current, incomplete bucket is never
evidence), a configured model is *active* in a bucket when it received direct requests.

* ``group`` edge S->T: T is active in the same buckets as S. association = buckets where both
  were active / buckets where S was active.
* ``next`` edge S->T: T becomes active one bucket after S. association = buckets t where S was
  active and T was active at t+1 / buckets t where S was active *and t+1 is complete*: an
  incomplete future bucket is excluded, never counted as a failed transition.

An edge is mature with at least :data:`MIN_SUPPORT` (3) supporting buckets and an association of
at least :data:`THRESHOLD` (0.70). Its rate ratio is the confidence-weighted historical ratio
of T's requests to S's requests over the supporting buckets.

Inferred demand for a quiet target is the *maximum* (never the sum) over at most
:data:`MAX_SOURCES` (32) currently active sources of ``source rate * ratio * confidence``,
capped at twice the target's observed peak bucket rate. Sources are only models with direct
current demand, so inference never propagates transitively. The result is tagged
``evidence="inferred"`` by the forecaster so the planner never lets it preempt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from grid.demand.fold import DemandState

MIN_SUPPORT = 3
THRESHOLD = 0.70
MAX_SOURCES = 32
PEAK_MULTIPLE = 2.0
# Supporting buckets at which an edge's confidence stops growing.
MATURE_SUPPORT = 6

KIND_GROUP = "group"
KIND_NEXT = "next"


class CorrelationEdge(msgspec.Struct, frozen=True, kw_only=True):
    source: str
    target: str
    kind: str  # group | next
    support: int
    association: float
    ratio: float
    confidence: float


class Inference(msgspec.Struct, frozen=True, kw_only=True):
    target: str
    source: str
    kind: str
    rate: float  # inferred requests per second, after the peak cap
    uncapped_rate: float
    peak_rate: float  # the target's observed peak bucket rate
    confidence: float


class Activity(msgspec.Struct, frozen=True, kw_only=True):
    """Bit masks of active complete buckets: bit i is bucket ``lo + i``; ``hi`` is the last complete."""

    lo: int
    hi: int
    masks: dict[str, int]


def activity(demand: DemandState, now: float, models: Sequence[str]) -> Activity:
    nb = int(now // demand.bucket_seconds)
    lo = nb - demand.max_buckets + 1
    hi = nb - 1
    masks: dict[str, int] = {}
    for m in models:
        series = demand.models.get(m)
        if series is None:
            continue
        mask = 0
        for bk in series.buckets:
            k = bk.index
            if lo <= k <= hi and bk.count > 0:
                mask |= 1 << (k - lo)
        if mask:
            masks[m] = mask
    return Activity(lo=lo, hi=hi, masks=masks)


def _ratio(demand: DemandState, source: str, target: str, support_mask: int, lo: int, shift: int) -> float:
    src = demand.models[source].by_index()
    dst = demand.models[target].by_index()
    s_sum = 0
    t_sum = 0
    i = 0
    mask = support_mask
    while mask:
        if mask & 1:
            s_sum += src[lo + i].count
            t_sum += dst[lo + i + shift].count
        mask >>= 1
        i += 1
    return t_sum / s_sum if s_sum else 0.0


def edges_from(demand: DemandState, act: Activity, source: str, targets: Sequence[str]) -> list[CorrelationEdge]:
    """Mature edges from ``source`` to each of ``targets`` (sorted by target, then kind)."""
    ms = act.masks.get(source, 0)
    if not ms:
        return []
    n_s = ms.bit_count()
    last_bit = 1 << (act.hi - act.lo)
    ms_next = ms & ~last_bit  # t+1 must be a complete bucket
    n_next = ms_next.bit_count()
    out: list[CorrelationEdge] = []
    for t in targets:
        if t == source:
            continue
        mt = act.masks.get(t, 0)
        if not mt:
            continue
        both = ms & mt
        support = both.bit_count()
        if support >= MIN_SUPPORT and support / n_s >= THRESHOLD:
            assoc = support / n_s
            ratio = _ratio(demand, source, t, both, act.lo, 0)
            out.append(CorrelationEdge(
                source=source, target=t, kind=KIND_GROUP, support=support, association=assoc,
                ratio=ratio, confidence=assoc * min(1.0, support / MATURE_SUPPORT),
            ))
        if n_next:
            follows = (mt >> 1) & ms_next  # bit t set when S at t and T at t+1
            support = follows.bit_count()
            if support >= MIN_SUPPORT and support / n_next >= THRESHOLD:
                assoc = support / n_next
                ratio = _ratio(demand, source, t, follows, act.lo, 1)
                out.append(CorrelationEdge(
                    source=source, target=t, kind=KIND_NEXT, support=support, association=assoc,
                    ratio=ratio, confidence=assoc * min(1.0, support / MATURE_SUPPORT),
                ))
    return out


def peak_rate(demand: DemandState, model: str, now: float) -> float:
    series = demand.models.get(model)
    if series is None:
        return 0.0
    nb = int(now // demand.bucket_seconds)
    lo = nb - demand.max_buckets + 1
    peak = 0
    for bk in series.buckets:
        if lo <= bk.index <= nb and bk.count > peak:
            peak = bk.count
    return peak / demand.bucket_seconds


def infer(
    demand: DemandState,
    now: float,
    source_rates: Mapping[str, float],
    quiet_targets: Sequence[str],
) -> tuple[dict[str, Inference], tuple[CorrelationEdge, ...]]:
    """Inferred demand for quiet targets from currently active sources.

    ``source_rates``: models with direct current demand and their observed rate (req/s).
    Returns (inference by target, every mature edge considered), both deterministic.
    """
    sources = sorted((m for m, r in source_rates.items() if r > 0.0), key=lambda m: (-source_rates[m], m))
    sources = sources[:MAX_SOURCES]
    targets = sorted(set(quiet_targets) - set(sources))
    if not sources or not targets:
        return {}, ()
    act = activity(demand, now, sorted(set(sources) | set(targets)))
    considered: list[CorrelationEdge] = []
    best: dict[str, Inference] = {}
    peaks: dict[str, float] = {}
    for s in sources:
        for e in edges_from(demand, act, s, targets):
            considered.append(e)
            peak = peaks.get(e.target)
            if peak is None:
                peak = peaks[e.target] = peak_rate(demand, e.target, now)
            raw = source_rates[s] * e.ratio * e.confidence
            rate = min(raw, PEAK_MULTIPLE * peak)
            old = best.get(e.target)
            if rate > 0.0 and (old is None or rate > old.rate):
                best[e.target] = Inference(
                    target=e.target, source=s, kind=e.kind, rate=rate, uncapped_rate=raw,
                    peak_rate=peak, confidence=e.confidence,
                )
    considered.sort(key=lambda e: (e.source, e.target, e.kind))
    return best, tuple(considered)
