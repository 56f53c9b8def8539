"""Demand projection: bounded, bucketed request aggregates folded from request events.

``apply(state, event, position_time, configured)`` folds ``RequestCompleted``,
``RequestFailed`` and ``RequestBatch`` (every other event is returned unchanged) into time
buckets of ``bucket_seconds`` (default 60 s) keyed by the log receipt time, keeping at most
``max_buckets`` (default 60) buckets.

* Direct demand: per configured, non-retiring ``requested_model`` (``configured`` is that
  set). Any other model name is counted in ``ignored`` and creates no state, so a flood of
  arbitrary names cannot grow the controller.
* Workload demand: requests routed by model ``auto`` (``features.auto``) count per workload
  class of the vocabulary, never as direct demand for the model the router happened to pick.
* Outcome evidence: every served request of a configured ``served_model`` (auto or not) is
  folded into :mod:`grid.demand.outcomes`, keyed by (model, workload, artifact sha256).
* Affinity sequences: records carrying ``affinity`` feed :mod:`grid.demand.affinity`.
* Evaluation-marked records (``features.evaluation``, which only the owner may set at the
  gateway) are skipped: evaluating a model must not manufacture demand for it.
* Quality evidence: the owner's ``EvaluationRecorded`` events (control stream) of configured
  models are folded into the same outcomes, keyed by the revision they name.
* The bucket length: a ``ForecastWindowSet`` (control stream) that changes it starts the bucketed
  series afresh at the new length (see ``_rewindow``); outcomes and affinity are kept.

Each bucket holds counts, errors, capacity-class errors, summed service and queue seconds,
reported queue depth, and a bounded logarithmic latency histogram (4 bins per doubling of
milliseconds, 80 bins) that gives an approximate request-level p95.

The fold mutates and returns ``state`` for speed. It performs no I/O and its result depends only
on its inputs; the state is a msgspec Struct that encodes deterministically.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Container, Iterable
from functools import lru_cache

import msgspec

from grid.events.base import Event
from grid.events.control import DEFAULT_FORECAST_BUCKET_SECONDS, ForecastWindowSet
from grid.events.evaluations import EvaluationRecorded
from grid.events.requests import WORKLOADS, RequestBatch, RequestCompleted, RequestFailed
from grid.demand import affinity as affinity_mod
from grid.demand import outcomes as outcomes_mod
from grid.demand.affinity import AffinityState
from grid.demand.outcomes import Outcomes

DEFAULT_BUCKET_SECONDS = DEFAULT_FORECAST_BUCKET_SECONDS
DEFAULT_MAX_BUCKETS = 60
HIST_BINS_PER_DOUBLING = 4
HIST_BINS = 80  # 1 ms .. 2**20 ms (about 17 minutes); longer requests land in the last bin
_MAX_DEPTH = 1_000_000
_MAX_SECONDS = 86_400.0

# Failures that say "not enough capacity", as opposed to a bad request.
CAPACITY_OUTCOMES = frozenset({"unavailable", "timeout", "rejected"})
CAPACITY_STATUS = frozenset({429, 502, 503, 504})
# Outcomes whose latency is a meaningful service observation.
_TIMED_OUTCOMES = frozenset({"ok", "timeout", "error"})


class Bucket(msgspec.Struct, kw_only=True, array_like=True, gc=False):
    index: int  # floor(receipt time / bucket_seconds)
    count: int = 0
    errors: int = 0
    pressure_errors: int = 0
    service_sum: float = 0.0
    service_n: int = 0
    queue_seconds: float = 0.0
    depth_sum: int = 0
    depth_max: int = 0
    # Latency histogram, dense from bin `hist_lo` (at most HIST_BINS entries).
    hist_lo: int = 0
    hist: list[int] = []

    def bins(self) -> Iterable[tuple[int, int]]:
        lo = self.hist_lo
        return ((lo + i, n) for i, n in enumerate(self.hist) if n)


class Series(msgspec.Struct, kw_only=True):
    # Ascending by index, at most max_buckets entries.
    buckets: list[Bucket] = []
    # Receipt time of the latest request: the demand watermark.
    last_seen: float | None = None

    def by_index(self) -> dict[int, Bucket]:
        return {bk.index: bk for bk in self.buckets}


class DemandState(msgspec.Struct, kw_only=True):
    bucket_seconds: float = DEFAULT_BUCKET_SECONDS
    max_buckets: int = DEFAULT_MAX_BUCKETS
    vocabulary: tuple[str, ...] = WORKLOADS
    # Highest bucket index folded so far.
    newest: int | None = None
    models: dict[str, Series] = {}
    workloads: dict[str, Series] = {}
    outcomes: Outcomes = {}
    affinity: AffinityState = msgspec.field(default_factory=AffinityState)
    # Records for model names that are not configured (a count only: names are never kept).
    ignored: int = 0
    # Records older than the retained window when they arrived.
    late: int = 0


def initial(
    bucket_seconds: float = DEFAULT_BUCKET_SECONDS,
    max_buckets: int = DEFAULT_MAX_BUCKETS,
    vocabulary: tuple[str, ...] = WORKLOADS,
) -> DemandState:
    if not (bucket_seconds > 0 and math.isfinite(bucket_seconds)) or max_buckets < 2:
        raise ValueError("bucket_seconds must be positive and max_buckets >= 2")
    return DemandState(bucket_seconds=bucket_seconds, max_buckets=max_buckets, vocabulary=tuple(vocabulary))


def bucket_index(state: DemandState, t: float) -> int:
    return int(t // state.bucket_seconds)


def latency_bin(seconds: float) -> int:
    ms = seconds * 1000.0
    if ms < 1.0:
        return 0
    b = int(math.log2(ms) * HIST_BINS_PER_DOUBLING)
    return b if b < HIST_BINS else HIST_BINS - 1


def bin_ms(b: int) -> float:
    """Representative latency of a bin: its geometric midpoint, in milliseconds."""
    return 2.0 ** ((b + 0.5) / HIST_BINS_PER_DOUBLING)


def percentile_ms(buckets: Iterable[Bucket], q: float = 0.95) -> float | None:
    """Approximate request-level percentile over the merged histograms of ``buckets``."""
    merged: dict[int, int] = {}
    for bk in buckets:
        for b, n in bk.bins():
            merged[b] = merged.get(b, 0) + n
    total = sum(merged.values())
    if total == 0:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for b in sorted(merged):
        seen += merged[b]
        if seen >= rank:
            return bin_ms(b)
    return bin_ms(max(merged))  # pragma: no cover - unreachable


def bucket_offered(bk: Bucket, bucket_seconds: float) -> float:
    """Offered concurrency of one bucket: arrival rate x mean service time + mean queued work.

    rate x mean service = (count / bucket) x (service_sum / service_n); requests without a
    measured service time are charged the mean of those with one.
    """
    if bk.count == 0:
        return 0.0
    rate = bk.count / bucket_seconds
    service = bk.service_sum / bk.service_n if bk.service_n else 0.0
    return rate * service + bk.depth_sum / bk.count


@lru_cache(maxsize=16)
def _vocab(vocabulary: tuple[str, ...]) -> tuple[frozenset[str], str]:
    fallback = "general" if "general" in vocabulary else (vocabulary[-1] if vocabulary else "general")
    return frozenset(vocabulary), fallback


def _advance(state: DemandState, b: int, configured: Container[str]) -> None:
    """Move the window to end at bucket ``b``: expire old buckets and unconfigured series."""
    state.newest = b
    cutoff = b - state.max_buckets + 1
    for table, check in ((state.models, True), (state.workloads, False)):
        for key in list(table):
            series = table[key]
            if check and key not in configured:
                del table[key]
                continue
            bks = series.buckets
            drop = 0
            while drop < len(bks) and bks[drop].index < cutoff:
                drop += 1
            if drop:
                del bks[:drop]
            if not bks:
                del table[key]
    outcomes_mod.prune(state.outcomes, configured)


def _bucket_at(bks: list[Bucket], b: int) -> Bucket:
    """The bucket with index ``b``, inserted in order when missing."""
    i = bisect.bisect_left(bks, b, key=lambda bk: bk.index)
    if i < len(bks) and bks[i].index == b:
        return bks[i]
    bk = Bucket(index=b)
    bks.insert(i, bk)
    return bk


def _fold(series: Series, b: int, r, t: float) -> None:
    bks = series.buckets
    if not bks or bks[-1].index < b:
        bk = Bucket(index=b)
        bks.append(bk)
    elif bks[-1].index == b:
        bk = bks[-1]
    else:
        bk = _bucket_at(bks, b)
    bk.count += 1
    outcome = r.outcome
    if outcome != "ok" and outcome != "cancelled":
        bk.errors += 1
        if outcome in CAPACITY_OUTCOMES or r.status_code in CAPACITY_STATUS:
            bk.pressure_errors += 1
    s = r.service_seconds
    if not (0.0 < s < _MAX_SECONDS):
        s = 0.0
    else:
        bk.service_sum += s
        bk.service_n += 1
    q = r.queue_seconds
    if not (0.0 < q < _MAX_SECONDS):
        q = 0.0
    else:
        bk.queue_seconds += q
    d = r.queue_depth
    if d > 0:
        if d > _MAX_DEPTH:
            d = _MAX_DEPTH
        bk.depth_sum += d
        if d > bk.depth_max:
            bk.depth_max = d
    lat = s + q
    if lat > 0.0 and outcome in _TIMED_OUTCOMES:
        ms = lat * 1000.0
        if ms < 1.0:
            hb = 0
        else:
            hb = int(math.log2(ms) * HIST_BINS_PER_DOUBLING)
            if hb >= HIST_BINS:
                hb = HIST_BINS - 1
        hist = bk.hist
        if not hist:
            bk.hist_lo = hb
            hist.append(1)
        else:
            i = hb - bk.hist_lo
            if i < 0:
                bk.hist = hist = [0] * (-i) + hist
                bk.hist_lo = hb
                i = 0
            elif i >= len(hist):
                hist.extend([0] * (i + 1 - len(hist)))
            hist[i] += 1
    if series.last_seen is None or t > series.last_seen:
        series.last_seen = t


def apply(state: DemandState, event: Event, position_time: float, configured: Container[str]) -> DemandState:
    """Fold one request event received at ``position_time`` (log receipt time)."""
    kind = type(event)
    if kind is RequestBatch:
        records = event.records  # type: ignore[attr-defined]
    elif kind is RequestCompleted or kind is RequestFailed:
        records = (event.features,)  # type: ignore[attr-defined]
    elif kind is EvaluationRecorded:
        return _evaluation(state, event, position_time, configured)  # type: ignore[arg-type]
    elif kind is ForecastWindowSet:
        return _rewindow(state, event.bucket_seconds)  # type: ignore[attr-defined]
    else:
        return state
    t = position_time
    if not records or not math.isfinite(t):
        return state
    b = int(t // state.bucket_seconds)
    if state.newest is None or b > state.newest:
        _advance(state, b, configured)
    elif b <= state.newest - state.max_buckets:
        state.late += len(records)
        return state
    vocab, fallback = _vocab(state.vocabulary)
    models = state.models
    workloads = state.workloads
    outcomes = state.outcomes
    aff = state.affinity
    ignored = 0
    for r in records:
        if r.evaluation:
            # The owner's evaluation traffic (only the owner can mark it): no demand, and no
            # service or quality evidence; quality arrives as EvaluationRecorded, and the
            # throughput projection still learns the engine's speed from it.
            continue
        wl = r.workload
        if wl not in vocab:
            wl = fallback
        if r.auto or r.requested_model == "auto":
            series = workloads.get(wl)
            if series is None:
                series = workloads[wl] = Series()
            _fold(series, b, r, t)
        else:
            m = r.requested_model
            if m in configured:
                series = models.get(m)
                if series is None:
                    series = models[m] = Series()
                _fold(series, b, r, t)
            else:
                ignored += 1
        served = r.served_model
        if served is not None and r.outcome != "cancelled" and served in configured:
            outcomes_mod.record(
                outcomes, served, wl, r.artifact_sha256 or "",
                ok=r.outcome == "ok",
                latency_seconds=r.service_seconds + r.queue_seconds,
                evaluation=r.evaluation,
                at=t,
            )
        if r.affinity:
            affinity_mod.record_completion(aff, r.affinity, wl, r.finished_at, t)
    if ignored:
        state.ignored += ignored
    return state


def _rewindow(state: DemandState, bucket_seconds: float) -> DemandState:
    """Buckets of ``bucket_seconds`` from now on. A bucket's counts cannot be split into shorter
    buckets (nor merged into longer ones without inventing when they arrived), so the bucketed
    series start empty: the forecast sees only demand observed at the new length, never demand
    it was not shown. Outcomes and affinity sequences are timestamped, not bucketed, and stay."""
    if not (math.isfinite(bucket_seconds) and bucket_seconds > 0) or bucket_seconds == state.bucket_seconds:
        return state
    state.bucket_seconds = float(bucket_seconds)
    state.newest = None
    state.models = {}
    state.workloads = {}
    return state


def _evaluation(state: DemandState, event: EvaluationRecorded, t: float, configured: Container[str]) -> DemandState:
    if event.model_id not in configured or not math.isfinite(t) or event.samples < 1:
        return state
    vocab, fallback = _vocab(state.vocabulary)
    wl = event.workload if event.workload in vocab else fallback
    outcomes_mod.record_evaluation(
        state.outcomes, event.model_id, wl, event.artifact_sha256 or "",
        passed=event.score * event.samples, total=float(event.samples), at=t,
    )
    return state


_encoder = msgspec.json.Encoder(order="deterministic")
_decoder = msgspec.json.Decoder(DemandState)


def encode_state(state: DemandState) -> bytes:
    return _encoder.encode(state)


def decode_state(data: bytes) -> DemandState:
    return _decoder.decode(data)


def copy_state(state: DemandState) -> DemandState:
    """An independent copy (the fold mutates): hand this to code that must not see later folds."""
    return _decoder.decode(_encoder.encode(state))
