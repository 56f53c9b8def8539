"""Demand forecast: bounded demand history -> desired replicas per configured model.

``forecast(demand, profiles, now, ...)`` is pure (explicit ``now``, sorted iteration, no I/O).
Its ``targets`` feed ``PlannerInput.demand``; its ``models`` / ``workloads`` rows are what
``gridctl status --json`` shows, each with its evidence and reason.

Direct demand (named-model requests), per model:

* rate: a bucketed EWMA (alpha 0.3) over the complete buckets since the series' first bucket in
  the window; the current, incomplete bucket counts as ``count / max(elapsed, bucket/2)`` when
  that is higher. ``observed_rate`` is this level.
* trend: least-squares slope over the last six complete buckets. Only a positive slope is used
  (negative trends never accelerate scale-down), confidence-weighted by the share of those
  buckets that saw traffic. The forecast adds ``slope * max(bucket, lookahead) * confidence``
  where lookahead is the fastest eligible load+warm path capped at five minutes, and the total
  never exceeds 2x the observed level.
* offered concurrency = forecast rate x measured service time (blended with the profile's
  ``expected_service_seconds`` until eight measurements) + mean reported queue depth over the
  current and previous bucket.
* replicas = ceil(offered / (replica_concurrency x target_utilization)); queue (>= 0.5),
  latency (approximate p95 above ``latency_slo_ms`` with >= 3 samples) or capacity-error
  (>= 5 % of recent requests) pressure asks for at least one replica beyond the ready
  replicas that were already serving when the pressure began (``ready_since``): a replica that
  became ready after it already answers it.
* hysteresis: ready replicas that claimed workloads (automatic traffic) justified in any bucket
  within ``scale_down_cooldown_seconds`` stay desired too (``cooldown_hold``), so replicas
  justified by `auto` traffic do not flap on small dips. Holds judge the window's peak at
  ``hold_band`` x the scale-up utilization (a band: demand hovering at a replica boundary keeps
  the replica instead of releasing it and starting it again minutes later).
* hysteresis (direct): while the demand watermark (latest of the projection's ``last_seen`` and the
  persisted ``watermarks``) is within ``scale_down_cooldown_seconds``, the ready replicas that
  demand justified during that window (at least one) stay desired; with only a watermark and
  no bucket history (a controller restart) every ready replica stays desired. Direct demand
  whose watermark is older than the cooldown (or one bucket) desires nothing: a decaying
  EWMA tail never keeps a model loaded past its cooldown.

Workload demand (automatic traffic) is projected onto the exploitation leader: the configured
model (among those some host could hold, when the caller passes ``placeable``) with the best
workload score adjusted by measured outcomes (:mod:`grid.demand.outcomes`),
a ready model winning exact ties. When the optimism bonus ranks a different, less proven model
first, that model is an exploration option; the forecast spends at most one exploration canary
(one replica, ``explore:<workload>``) on the workload with the most projected concurrency. Admission needs three
observations in the gate window, or >= 1.5 offered-concurrency units; crossing only the
concurrency gate, without a fresh validated success of that model/workload/artifact and
without direct demand, is weak evidence capped at a one-replica canary. The workload queue is
not added to the model's projected concurrency (it has not been served by that model).
With two or more active workloads the tick passes ``portfolio``, the joint search's
workload -> model map (:mod:`grid.demand.portfolio`); a mapped workload is projected onto that
candidate instead of its leader (rows: ``independent_model_id``, ``joint``) and adds no
exploration canary of its own.

Correlation (:mod:`grid.demand.correlation`) and affinity sequences
(:mod:`grid.demand.affinity`) add ``evidence="inferred"`` prewarm targets for quiet models.
Everything is bounded by ``[min_replicas, max(max_replicas, min_replicas)]``.

``forecast()`` runs the steps in that order: ``_direct_demand``, ``_workload_demand``,
``_inferred_demand``, then ``_model_forecast`` per model. The file is longer than our usual 600
lines on purpose: the rules above, the rows ``gridctl status`` shows and the steps that fill
them share one configuration and one set of series statistics, and read top to bottom here.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

import msgspec

from grid.events.control import ModelProfile
from grid.demand import affinity as affinity_mod
from grid.demand import correlation as correlation_mod
from grid.demand import outcomes as outcomes_mod
from grid.demand.affinity import SequenceEdge, SequencePrediction
from grid.demand.correlation import CorrelationEdge
from grid.planner.types import DemandTarget, Harm, TimingSample, Value
from grid.demand.fold import Bucket, DemandState, Series, percentile_ms

FORECAST_VERSION = "forecast-1"

# Reason constants (joined with "+" in DemandTarget.reason / ModelForecast.reason).
REASON_DIRECT = "direct_load"
REASON_LOOKAHEAD = "rising_lookahead"
REASON_QUEUE = "queue_pressure"
REASON_LATENCY = "latency_pressure"
REASON_ERRORS = "error_pressure"
REASON_HOLD = "cooldown_hold"
REASON_BASELINE = "min_replicas"
REASON_MAX = "max_replicas"
REASON_WORKLOAD = "workload"  # workload:<name>
REASON_CANARY = "canary"
REASON_CORRELATION = "correlation"  # correlation:<kind>:<source>
REASON_SEQUENCE = "sequence"  # sequence:<src>-><dst>@<confidence>
REASON_EXPLORE = "explore"  # explore:<workload>: the single exploration canary
REASON_IDLE = "idle"

# Workload admission reasons.
GATE_OBSERVATIONS = "observations"
GATE_CONCURRENCY = "concurrency"
GATE_SEQUENCE = "sequence"
WORKLOAD_BELOW_GATE = "below_evidence_gate"
WORKLOAD_NO_CANDIDATE = "no_candidate"
WORKLOAD_ADMITTED = "admitted"
WORKLOAD_IDLE = "idle"

MAX_CANDIDATES_SHOWN = 4


class ForecastConfig(Value, frozen=True, kw_only=True):
    ewma_alpha: float = 0.3
    trend_buckets: int = 6
    max_lookahead_seconds: float = 300.0
    max_growth: float = 2.0
    min_offered: float = 0.01
    queue_pressure: float = 0.5
    min_latency_samples: int = 3
    error_pressure_ratio: float = 0.05
    pressure_buckets: int = 2
    # Scale-down band: a held replica stays desired while the cooldown window's peak would need
    # it at this fraction of the scale-up utilization (scale up above 0.7 per replica, release
    # only below 0.7 x hold_band), so demand hovering at a boundary does not flap a replica.
    hold_band: float = 0.7
    evidence_observations: int = 3
    evidence_concurrency: float = 1.5
    gate_buckets: int = 15
    service_prior_samples: float = 8.0
    authoritative_timing_samples: int = 4


class ModelForecast(Value, frozen=True, kw_only=True):
    model_id: str
    target: int = 0
    evidence: str = ""  # baseline | direct | inferred | "" (nothing desired)
    canary: bool = False
    reason: str = REASON_IDLE
    observed_rate: float = 0.0  # req/s, direct only (inferred demand never lands here)
    ewma: float = 0.0
    trend: float = 0.0  # raw least-squares slope, req/s per second (may be negative)
    rate: float = 0.0  # forecast direct req/s including the positive trend / lookahead
    lookahead_seconds: float = 0.0
    service_seconds: float = 0.0
    offered_concurrency: float = 0.0  # total used for the target
    direct_offered: float = 0.0
    workload_offered: float = 0.0
    inferred_rate: float = 0.0
    inferred_offered: float = 0.0
    peak_rate: float = 0.0
    p95_ms: float | None = None
    latency_slo_ms: float | None = None
    errors: int = 0
    error_ratio: float = 0.0
    queue: float = 0.0
    requests: int = 0  # requests in the retained window
    ready: int = 0
    last_seen: float | None = None
    hold_until: float | None = None
    workloads: tuple[str, ...] = ()


class Candidate(Value, frozen=True, kw_only=True):
    model_id: str
    suitability: float
    score: float
    confidence: float
    quality_confidence: float
    samples: float
    quality_samples: float
    bonus: float
    validated: bool
    ready: int = 0
    service_age_seconds: float | None = None
    quality_age_seconds: float | None = None


class WorkloadForecast(Value, frozen=True, kw_only=True):
    workload: str
    status: str = WORKLOAD_IDLE
    gate: str = ""
    observations: int = 0
    observed_rate: float = 0.0
    rate: float = 0.0
    trend: float = 0.0
    service_seconds: float = 0.0
    offered_concurrency: float = 0.0
    projected_concurrency: float = 0.0  # offered without the unserved queue
    queue: float = 0.0
    errors: int = 0
    p95_ms: float | None = None
    model_id: str | None = None
    replicas: int = 0
    canary: bool = False
    sequence_source: str | None = None
    sequence_confidence: float = 0.0
    # The bonus-ranked leader when it differs from model_id; exploring=True when this
    # workload holds the forecast's single exploration canary.
    explore_model_id: str | None = None
    exploring: bool = False
    candidates: tuple[Candidate, ...] = ()
    # The independent (exploitation) choice, and joint=True when the joint portfolio search
    # (grid.demand.portfolio) projected this workload onto a different model_id instead.
    independent_model_id: str | None = None
    joint: bool = False


class Forecast(Value, frozen=True, kw_only=True):
    version: str = FORECAST_VERSION
    now: float
    bucket_seconds: float
    window_buckets: int
    evidence_observations: int
    evidence_concurrency: float
    targets: tuple[DemandTarget, ...] = ()
    models: tuple[ModelForecast, ...] = ()
    workloads: tuple[WorkloadForecast, ...] = ()
    correlations: tuple[CorrelationEdge, ...] = ()
    sequences: tuple[SequenceEdge, ...] = ()
    predictions: tuple[SequencePrediction, ...] = ()
    ignored_requests: int = 0


class _Stats(msgspec.Struct, kw_only=True):
    observed: float = 0.0
    ewma: float = 0.0
    slope: float = 0.0
    confidence: float = 0.0
    rate: float = 0.0
    lookahead: float = 0.0
    lookahead_used: bool = False
    service: float = 0.0
    queue: float = 0.0
    offered: float = 0.0
    p95_ms: float | None = None
    latency_samples: int = 0
    errors: int = 0
    pressure_errors: int = 0
    recent: int = 0
    requests: int = 0
    observations: int = 0
    peak_rate: float = 0.0
    # Start of the earliest recent bucket with traffic: when the pressure evidence began.
    pressure_from: float | None = None


def _finite(x: float, default: float = 0.0) -> float:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else default


def _series_stats(
    series: Series | None,
    demand: DemandState,
    now: float,
    prior_service: float,
    start_seconds: float,
    cfg: ForecastConfig,
    fast_up: bool = False,
) -> _Stats:
    st = _Stats()
    if series is None:
        return st
    bs = demand.bucket_seconds
    nb = int(now // bs)
    lo = nb - demand.max_buckets + 1
    bks: dict[int, Bucket] = series.by_index()
    keys = sorted(k for k in bks if lo <= k <= nb)
    if not keys:
        return st
    first = keys[0]
    rates = [(bks[k].count / bs if k in bks else 0.0) for k in range(first, nb)]
    alpha = min(1.0, max(0.0, cfg.ewma_alpha))
    ewma = 0.0
    if rates:
        ewma = rates[0]
        for r in rates[1:]:
            ewma += alpha * (r - ewma)
    cur = bks.get(nb)
    partial = 0.0
    if cur is not None and cur.count:
        elapsed = max(now - nb * bs, bs / 2.0)
        partial = cur.count / elapsed
    # Fast up, slow down: a workload whose model already serves scales up on its latest complete
    # minute (the smoothed rate lagged a surge by minutes while the running replicas refused
    # work); scale-down stays on the smoothed rate and the cooldown hold.
    observed = max(ewma, partial, rates[-1] if fast_up and rates else 0.0)
    # Trend over the last complete buckets.
    pts = rates[-max(2, cfg.trend_buckets):]
    slope = 0.0
    conf = 0.0
    if len(pts) >= 3:
        n = len(pts)
        mx = (n - 1) / 2.0
        my = sum(pts) / n
        den = sum((i - mx) ** 2 for i in range(n))
        slope = sum((i - mx) * (y - my) for i, y in enumerate(pts)) / den / bs
        conf = sum(1 for y in pts if y > 0) / max(n, cfg.trend_buckets)
    pos = max(0.0, slope)
    lookahead = min(max(0.0, start_seconds), cfg.max_lookahead_seconds)
    trend_term = pos * bs * conf
    look_term = pos * lookahead * conf
    growth = min(observed * max(0.0, cfg.max_growth - 1.0), max(trend_term, look_term))
    rate = observed + growth
    # Service time and window totals.
    s_sum = 0.0
    s_n = 0
    requests = 0
    peak = 0
    gate_lo = nb - max(1, cfg.gate_buckets) + 1
    observations = 0
    for k in keys:
        bk = bks[k]
        s_sum += bk.service_sum
        s_n += bk.service_n
        requests += bk.count
        if bk.count > peak:
            peak = bk.count
        if k >= gate_lo:
            observations += bk.count
    if s_n and prior_service > 0:
        w = min(1.0, s_n / max(1.0, cfg.service_prior_samples))
        service = w * (s_sum / s_n) + (1.0 - w) * prior_service
    elif s_n:
        service = s_sum / s_n
    else:
        service = max(0.0, prior_service)
    # Recent pressure: the current and previous bucket(s).
    recent_keys = [k for k in keys if k > nb - max(1, cfg.pressure_buckets)]
    recent = [bks[k] for k in recent_keys]
    busy = [k for k in recent_keys if bks[k].count]
    st.pressure_from = busy[0] * bs if busy else None
    r_count = sum(b.count for b in recent)
    depth = sum(b.depth_sum for b in recent)
    queue = depth / r_count if r_count else 0.0
    st.observed = observed
    st.ewma = ewma
    st.slope = slope
    st.confidence = conf
    st.rate = rate
    st.lookahead = lookahead
    st.lookahead_used = growth > 0.0 and look_term > trend_term
    st.service = service
    st.queue = queue
    st.offered = rate * service + queue
    st.p95_ms = percentile_ms(recent)
    st.latency_samples = sum(sum(b.hist) for b in recent)
    st.errors = sum(b.errors for b in recent)
    st.pressure_errors = sum(b.pressure_errors for b in recent)
    st.recent = r_count
    st.requests = requests
    st.observations = observations
    st.peak_rate = peak / bs
    return st


def _capacity(p: ModelProfile) -> float:
    util = _finite(p.target_utilization, 0.7)
    util = min(1.0, max(0.05, util))
    return max(1, p.replica_concurrency) * util


def _band(cfg: ForecastConfig) -> float:
    return min(1.0, max(0.1, _finite(cfg.hold_band, 1.0)))


def _replicas_for(offered: float, cap: float, cfg: ForecastConfig) -> int:
    if not offered >= cfg.min_offered:
        return 0
    return max(1, math.ceil(offered / cap - 1e-9))


def _start_seconds(
    profiles: Sequence[ModelProfile],
    fastest_start_seconds: Mapping[str, float],
    timings: Sequence[TimingSample],
    cfg: ForecastConfig,
) -> dict[str, float]:
    by_id = {p.model_id: p for p in profiles}
    learned: dict[str, float] = {}
    for s in timings:
        p = by_id.get(s.model_id)
        if p is None or s.samples < cfg.authoritative_timing_samples or s.artifact_sha256 != p.artifact_sha256:
            continue
        load = s.load_seconds if s.load_seconds is not None else p.load_seconds
        warm = s.warm_seconds if s.warm_seconds is not None else p.warm_seconds
        total = _finite(load, p.load_seconds) + _finite(warm, p.warm_seconds)
        if total >= 0 and (s.model_id not in learned or total < learned[s.model_id]):
            learned[s.model_id] = total
    out: dict[str, float] = {}
    for m, p in by_id.items():
        given = fastest_start_seconds.get(m)
        if given is not None and math.isfinite(given) and given >= 0:
            out[m] = given
        elif m in learned:
            out[m] = learned[m]
        else:
            out[m] = max(0.0, _finite(p.load_seconds) + _finite(p.warm_seconds))
    return out


def _exploit_key(cv: tuple[Candidate, outcomes_mod.OutcomeView]) -> tuple[float, int, str]:
    c = cv[0]
    return (-(c.score - c.bonus), -(c.ready > 0), c.model_id)


def _candidates(
    demand: DemandState,
    workload: str,
    profiles: Sequence[ModelProfile],
    now: float,
    ready: Mapping[str, int],
) -> list[tuple[Candidate, outcomes_mod.OutcomeView]]:
    out = []
    for p in profiles:
        suit = outcomes_mod.suitability_points(p.workload_scores.get(workload, 0.0))
        if suit <= 0.0 or max(p.max_replicas, p.min_replicas) <= 0:
            continue
        view = outcomes_mod.view(demand.outcomes, p.model_id, workload, p.artifact_sha256, now)
        slo = p.latency_slo_ms / 1000.0 if p.latency_slo_ms else None
        score = outcomes_mod.candidate_score(suit, view, slo_seconds=slo)
        out.append((Candidate(
            model_id=p.model_id, suitability=suit, score=score, confidence=view.confidence,
            quality_confidence=view.quality_confidence, samples=view.samples,
            quality_samples=view.quality_samples, bonus=view.bonus, validated=view.validated,
            ready=max(0, int(ready.get(p.model_id, 0))),
            service_age_seconds=view.service_age_seconds, quality_age_seconds=view.quality_age_seconds,
        ), view))
    # Best score first; a ready candidate wins an exact tie; model id is the final tie-break.
    out.sort(key=lambda cv: (-cv[0].score, -(cv[0].ready > 0), cv[0].model_id))
    return out


def _peak_need(
    series: Series | None, demand: DemandState, now: float, window: float, service: float,
    cap: float, cfg: ForecastConfig,
) -> int | None:
    """Largest replica need of any bucket overlapping ``[now - window, now]``.

    None when the projection holds no bucket in that window (e.g. only a persisted watermark
    after a restart): the caller then keeps every ready replica.
    """
    if series is None:
        return None
    bs = demand.bucket_seconds
    nb = int(now // bs)
    peak: int | None = None
    for bk in series.buckets:
        k = bk.index
        if k > nb or (k + 1) * bs <= now - window or not bk.count:
            continue
        duration = bs if k < nb else max(now - k * bs, bs / 2.0)
        offered = bk.count / duration * service + bk.depth_sum / bk.count
        need = _replicas_for(offered, cap, cfg)
        peak = need if peak is None else max(peak, need)
    return peak


def _workload_peak_need(
    workloads: Sequence[str], demand: DemandState, now: float, window: float, prior_service: float, cap: float,
    cfg: ForecastConfig,
) -> int:
    """Largest replica need of any bucket in ``[now - window, now]`` from the workloads' combined
    arrivals x service time (their queue is left out: it was not served by this model)."""
    bs = demand.bucket_seconds
    nb = int(now // bs)
    offered: dict[int, float] = {}
    for w in workloads:
        series = demand.workloads.get(w)
        if series is None:
            continue
        for bk in series.buckets:
            k = bk.index
            if k > nb or (k + 1) * bs <= now - window or not bk.count:
                continue
            duration = bs if k < nb else max(now - k * bs, bs / 2.0)
            service = bk.service_sum / bk.service_n if bk.service_n else prior_service
            offered[k] = offered.get(k, 0.0) + bk.count / duration * service
    return max((_replicas_for(v, cap, cfg) for v in offered.values()), default=0)


class _WorkloadClaim(msgspec.Struct, kw_only=True):
    offered: float = 0.0
    canary: bool = True
    workloads: list[str] = []
    sequence_reasons: list[str] = []
    explore: list[str] = []


def forecast(
    demand: DemandState,
    profiles: Sequence[ModelProfile],
    now: float,
    *,
    ready_replicas: Mapping[str, int] = {},
    ready_since: Mapping[str, Sequence[float | None]] = {},
    watermarks: Mapping[str, float] = {},
    fastest_start_seconds: Mapping[str, float] = {},
    timings: Sequence[TimingSample] = (),
    retired: frozenset[str] | Sequence[str] = frozenset(),
    config: ForecastConfig = ForecastConfig(),
    placeable: Collection[str] | None = None,
    portfolio: Mapping[str, str] | None = None,
) -> Forecast:
    """Desired replicas per configured, non-retired model at ``now`` (pure).

    Three demand steps (direct, workload, inferred), then one combination per model.
    ``placeable``: the models some host could ever hold (grid.planner.fleet_scan); workload
    demand is projected only onto those, so a model that fits nowhere never suppresses a
    usable fallback. None: every configured model is a candidate.
    ``ready_since``: per model, when each ready replica became ready (None: unknown, long ago);
    pressure then asks for one replica beyond those that were serving when it was measured.
    A model it does not name counts all its ready replicas as serving throughout.
    ``portfolio``: workload -> model chosen by the joint search (grid.demand.portfolio); a
    workload absent from it, or mapped to a model that is not its candidate, keeps its leader.
    """
    cfg = config
    retired_set = frozenset(retired)
    # One profile per id (the last given wins, deterministically by input order).
    by_id: dict[str, ModelProfile] = {}
    for p in profiles:
        if p.model_id not in retired_set:
            by_id[p.model_id] = p
    live = [by_id[m] for m in sorted(by_id)]
    starts = _start_seconds(live, fastest_start_seconds, timings, cfg)

    stats = _direct_demand(demand, live, starts, now, cfg)
    seq_preds = affinity_mod.predictions(demand.affinity, now)
    candidates = live if placeable is None else [p for p in live if p.model_id in placeable]
    claims, workload_rows = _workload_demand(demand, candidates, by_id, starts, seq_preds, now, ready_replicas, cfg,
                                             portfolio or {})
    inferred, considered = _inferred_demand(demand, live, stats, now)

    targets: list[DemandTarget] = []
    rows: list[ModelForecast] = []
    for p in live:
        m = p.model_id
        target, row = _model_forecast(
            p, stats[m], claims.get(m), inferred.get(m), demand, now,
            ready=max(0, int(ready_replicas.get(m, 0))), watermark=watermarks.get(m), cfg=cfg,
            since=ready_since.get(m),
        )
        if target is not None:
            targets.append(target)
        rows.append(row)
    return Forecast(
        now=now,
        bucket_seconds=demand.bucket_seconds,
        window_buckets=demand.max_buckets,
        evidence_observations=cfg.evidence_observations,
        evidence_concurrency=cfg.evidence_concurrency,
        targets=tuple(targets),
        models=tuple(rows),
        workloads=tuple(workload_rows),
        correlations=considered,
        sequences=affinity_mod.edges(demand.affinity, now),
        predictions=seq_preds,
        ignored_requests=demand.ignored,
    )


# --- 1. direct demand ---------------------------------------------------------------------------


def _direct_demand(
    demand: DemandState, live: Sequence[ModelProfile], starts: Mapping[str, float], now: float, cfg: ForecastConfig,
) -> dict[str, _Stats]:
    """Rate, trend, service time and pressure of each model's named-model requests."""
    stats: dict[str, _Stats] = {}
    for p in live:
        prior = _finite(p.expected_service_seconds, 2.0)
        stats[p.model_id] = _series_stats(demand.models.get(p.model_id), demand, now, prior, starts[p.model_id], cfg)
    return stats


# --- 2. workload demand -------------------------------------------------------------------------


def _workload_demand(
    demand: DemandState,
    live: Sequence[ModelProfile],
    by_id: Mapping[str, ModelProfile],
    starts: Mapping[str, float],
    seq_preds: Sequence[SequencePrediction],
    now: float,
    ready_replicas: Mapping[str, int],
    cfg: ForecastConfig,
    portfolio: Mapping[str, str],
) -> tuple[dict[str, _WorkloadClaim], list[WorkloadForecast]]:
    """Automatic traffic per workload, projected onto its exploitation leader (the claims)."""
    claims: dict[str, _WorkloadClaim] = {}
    explore_options: list[tuple[float, int, str, str]] = []
    rows: list[WorkloadForecast] = []
    pred_by_target: dict[str, SequencePrediction] = {}
    for pr in seq_preds:
        old = pred_by_target.get(pr.target)
        if old is None or (pr.expected, pr.confidence) > (old.expected, old.confidence):
            pred_by_target[pr.target] = pr
    for w in demand.vocabulary:
        series = demand.workloads.get(w)
        pred = pred_by_target.get(w)
        if series is None and pred is None:
            continue
        row, projected = _workload_row(w, series, pred, demand, live, by_id, starts, now, ready_replicas, cfg,
                                       portfolio.get(w))
        if row.status == WORKLOAD_ADMITTED:
            claim = _claim(claims, row.model_id)  # type: ignore[arg-type]
            claim.offered += projected
            claim.canary = claim.canary and row.canary
            claim.workloads.append(w)
            if row.gate == GATE_SEQUENCE and pred is not None:
                claim.sequence_reasons.append(f"{REASON_SEQUENCE}:{pred.source}->{pred.target}@{pred.confidence:.2f}")
            if row.explore_model_id is not None:
                explore_options.append((projected, len(rows), w, row.explore_model_id))
        rows.append(row)

    # Exploration budget: at most one uncertain model differs from the exploitation choice,
    # for the workload with the most projected concurrency (vocabulary order breaks ties).
    if explore_options:
        _, index, w, model_id = min(explore_options, key=lambda o: (-o[0], o[1]))
        rows[index] = msgspec.structs.replace(rows[index], exploring=True)
        _claim(claims, model_id).explore.append(w)
    return claims, rows


def _claim(claims: dict[str, _WorkloadClaim], model_id: str) -> _WorkloadClaim:
    claim = claims.get(model_id)
    if claim is None:
        claim = claims[model_id] = _WorkloadClaim(workloads=[], sequence_reasons=[])
    return claim


def _workload_row(
    w: str,
    series: Series | None,
    pred: SequencePrediction | None,
    demand: DemandState,
    live: Sequence[ModelProfile],
    by_id: Mapping[str, ModelProfile],
    starts: Mapping[str, float],
    now: float,
    ready_replicas: Mapping[str, int],
    cfg: ForecastConfig,
    chosen: str | None = None,
) -> tuple[WorkloadForecast, float]:
    """One workload's row and the concurrency it projects onto its leader (0 unless admitted)."""
    ranked = _candidates(demand, w, live, now, ready_replicas)
    # Exploitation leader: measured score without the optimism bonus. The bonus-ranked
    # leader, when different, is only an exploration option (one canary per forecast).
    best = min(ranked, key=_exploit_key) if ranked else None
    explore = ranked[0] if ranked and ranked[0][0].model_id != best[0].model_id else None  # type: ignore[index]
    independent = best[0].model_id if best is not None else None
    if chosen is not None and chosen != independent and any(c.model_id == chosen for c, _ in ranked):
        # The joint portfolio search's choice replaces the leader; the search spent this
        # workload's exploration budget, so no extra canary is added for it.
        best = next(cv for cv in ranked if cv[0].model_id == chosen)
        explore = None
    leader = by_id[best[0].model_id] if best is not None else None
    prior = _finite(leader.expected_service_seconds, 2.0) if leader is not None else 0.0
    st = _series_stats(series, demand, now, prior, starts[leader.model_id] if leader is not None else 0.0, cfg,
                       fast_up=leader is not None and ready_replicas.get(leader.model_id, 0) > 0)
    row = dict(
        workload=w, observations=st.observations, observed_rate=st.observed, rate=st.rate,
        trend=st.slope, service_seconds=st.service, offered_concurrency=st.offered,
        projected_concurrency=st.rate * st.service, queue=st.queue, errors=st.errors,
        p95_ms=st.p95_ms, candidates=tuple(c for c, _ in ranked[:MAX_CANDIDATES_SHOWN]),
        independent_model_id=independent, joint=best is not None and best[0].model_id != independent,
    )
    gate = ""
    if st.observations >= cfg.evidence_observations and (st.offered >= cfg.min_offered or st.recent > 0):
        gate = GATE_OBSERVATIONS
    elif st.offered >= cfg.evidence_concurrency:
        gate = GATE_CONCURRENCY
    elif pred is not None:
        gate = GATE_SEQUENCE
    if not gate:
        return WorkloadForecast(status=WORKLOAD_BELOW_GATE if st.requests else WORKLOAD_IDLE, **row), 0.0
    if best is None or leader is None:
        return WorkloadForecast(status=WORKLOAD_NO_CANDIDATE, gate=gate, **row), 0.0
    cand, view = best
    projected = st.rate * st.service if gate != GATE_SEQUENCE else 0.0
    canary = gate != GATE_OBSERVATIONS and not view.validated
    replicas = 1 if canary else max(1, _replicas_for(projected, _capacity(leader), cfg))
    sequenced = pred is not None and gate == GATE_SEQUENCE
    return WorkloadForecast(
        status=WORKLOAD_ADMITTED, gate=gate, model_id=cand.model_id, replicas=replicas, canary=canary,
        explore_model_id=explore[0].model_id if explore is not None else None,
        sequence_source=pred.source if sequenced else None,  # type: ignore[union-attr]
        sequence_confidence=pred.confidence if sequenced else 0.0,  # type: ignore[union-attr]
        **row,
    ), projected


# --- 3. inferred demand -------------------------------------------------------------------------


def _inferred_demand(
    demand: DemandState, live: Sequence[ModelProfile], stats: Mapping[str, _Stats], now: float,
) -> tuple[dict[str, correlation_mod.Inference], tuple[CorrelationEdge, ...]]:
    """Correlation: quiet targets inferred from models with direct current demand."""
    source_rates: dict[str, float] = {}
    quiet: list[str] = []
    for p in live:
        m = p.model_id
        st = stats[m]
        if st.recent > 0 and st.observed > 0:
            source_rates[m] = st.observed
        elif max(p.max_replicas, p.min_replicas) > 0:
            quiet.append(m)
    return correlation_mod.infer(demand, now, source_rates, quiet)


# --- combination per model ----------------------------------------------------------------------


class _DirectNeed(msgspec.Struct, kw_only=True):
    replicas: int
    offered: float
    reasons: list[str]
    latency_ratio: float
    error_ratio: float
    last_seen: float | None
    hold_until: float | None


def _direct_need(
    p: ModelProfile, st: _Stats, series: Series | None, demand: DemandState, now: float, ready: int,
    watermark: float | None, cfg: ForecastConfig, since: Sequence[float | None] | None = None,
) -> _DirectNeed:
    """Replicas direct demand asks for: load, pressure beyond the ready set, cooldown hold."""
    cap = _capacity(p)
    reasons: list[str] = []
    # Staleness: direct demand older than the cooldown no longer desires anything.
    last_seen = series.last_seen if series is not None else None
    if watermark is not None and math.isfinite(watermark) and (last_seen is None or watermark > last_seen):
        last_seen = watermark
    cooldown = max(0.0, _finite(p.scale_down_cooldown_seconds))
    fresh = last_seen is not None and now - last_seen <= max(cooldown, demand.bucket_seconds)
    direct_offered = st.offered if fresh else 0.0
    need = _replicas_for(direct_offered, cap, cfg)
    if need:
        reasons.append(REASON_DIRECT)
        if st.lookahead_used:
            reasons.append(REASON_LOOKAHEAD)
    pressure = False
    if st.recent and st.queue >= cfg.queue_pressure:
        reasons.append(REASON_QUEUE)
        pressure = True
    slo = p.latency_slo_ms
    latency_ratio = 0.0
    if slo and slo > 0 and st.p95_ms is not None:
        latency_ratio = st.p95_ms / slo
        if st.latency_samples >= cfg.min_latency_samples and st.p95_ms > slo:
            reasons.append(REASON_LATENCY)
            pressure = True
    error_ratio = st.errors / st.recent if st.recent else 0.0
    if st.pressure_errors and st.pressure_errors / st.recent >= cfg.error_pressure_ratio:
        reasons.append(REASON_ERRORS)
        pressure = True
    if pressure:
        # One replica beyond those that were serving when the pressure was measured: a replica
        # that became ready since already answers it (counting it again scaled up twice for one
        # burst, and the extra replica was unloaded minutes later).
        serving = ready
        if since is not None and st.pressure_from is not None:
            serving = min(ready, sum(1 for t in since if t is None or t <= st.pressure_from))
        need = max(need, serving + 1)
    # Hysteresis: within the cooldown after the last demand, ready replicas that demand
    # justified during the cooldown window stay desired (at least one: a quiet minute or
    # a controller restart never unloads a model that was just used).
    hold_until = None
    if last_seen is not None and now - last_seen <= cooldown:
        hold_until = last_seen + cooldown
        peak = _peak_need(series, demand, now, cooldown, st.service, cap * _band(cfg), cfg)
        hold = max(1, ready if peak is None else min(ready, peak))
        if hold > need:
            need = hold
            reasons.append(REASON_HOLD)
    return _DirectNeed(replicas=need, offered=direct_offered, reasons=reasons, latency_ratio=latency_ratio,
                       error_ratio=error_ratio, last_seen=last_seen, hold_until=hold_until)


def _model_forecast(
    p: ModelProfile,
    st: _Stats,
    claim: _WorkloadClaim | None,
    inf: correlation_mod.Inference | None,
    demand: DemandState,
    now: float,
    *,
    ready: int,
    watermark: float | None,
    cfg: ForecastConfig,
    since: Sequence[float | None] | None = None,
) -> tuple[DemandTarget | None, ModelForecast]:
    """Direct, workload and inferred demand combined into one bounded target (None = nothing desired)."""
    m = p.model_id
    cap = _capacity(p)
    direct = _direct_need(p, st, demand.models.get(m), demand, now, ready, watermark, cfg, since)
    reasons = direct.reasons
    inf_offered = inf.rate * st.service if inf is not None else 0.0
    inf_need = max(1, _replicas_for(inf_offered, cap, cfg)) if inf is not None else 0
    wl_offered = claim.offered if claim is not None else 0.0
    evidence = ""
    canary = False
    offered = 0.0
    if direct.replicas:
        offered = direct.offered + wl_offered
        replicas = max(direct.replicas, _replicas_for(offered, cap, cfg))
        evidence = "direct"
        if claim is not None:
            reasons.extend(f"{REASON_WORKLOAD}:{w}" for w in claim.workloads)
            reasons.extend(f"{REASON_EXPLORE}:{w}" for w in claim.explore)
    elif claim is not None or inf is not None:
        wl_need = 0
        if claim is not None:
            wl_need = 1 if claim.canary else max(1, _replicas_for(wl_offered, cap, cfg))
            reasons.extend(f"{REASON_WORKLOAD}:{w}" for w in claim.workloads)
            reasons.extend(claim.sequence_reasons)
            reasons.extend(f"{REASON_EXPLORE}:{w}" for w in claim.explore)
        if inf is not None:
            reasons.append(f"{REASON_CORRELATION}:{inf.kind}:{inf.source}")
        replicas = max(wl_need, inf_need)
        offered = wl_offered + inf_offered
        evidence = "inferred"
        canary = claim is not None and claim.canary and inf_need <= 1
        if canary:
            replicas = 1
            reasons.append(REASON_CANARY)
    else:
        replicas = 0
    if claim is not None and not canary and ready > replicas:
        # Hysteresis for automatic traffic, as for named demand: ready replicas the claimed
        # workloads justified within the cooldown stay desired, so a small dip in `auto`
        # traffic does not unload a replica that the next minute loads again. A canary stays
        # one replica (weak evidence is never held above its cap).
        cooldown = max(0.0, _finite(p.scale_down_cooldown_seconds))
        peak = _workload_peak_need(claim.workloads, demand, now, cooldown, _finite(p.expected_service_seconds, 2.0),
                                   cap * _band(cfg), cfg)
        hold = min(ready, peak)
        if hold > replicas:
            replicas = hold
            reasons.append(REASON_HOLD)
    if p.min_replicas > 0 and p.min_replicas >= replicas:
        replicas = p.min_replicas
        evidence = "baseline"
        canary = False
        reasons.append(REASON_BASELINE)
    hi = max(p.max_replicas, p.min_replicas, 0)
    if replicas > hi:
        replicas = hi
        reasons.append(REASON_MAX)
    if replicas <= 0:
        replicas = 0
        evidence = ""
        canary = False
    reason = "+".join(reasons) if reasons else REASON_IDLE
    direct_evidence = evidence in ("direct", "baseline")
    harm = Harm(
        queue=st.queue if direct_evidence else 0.0,
        latency_ratio=direct.latency_ratio if direct_evidence else 0.0,
        errors=float(st.errors) if direct_evidence else 0.0,
        concurrency=max(0.0, offered),
        rate=st.observed if direct_evidence else 0.0,
    )
    target = None
    if replicas > 0:
        target = DemandTarget(
            model_id=m, replicas=replicas, evidence=evidence, harm=harm,  # type: ignore[arg-type]
            offered_concurrency=max(0.0, offered), canary=canary, reason=reason,
        )
    row = ModelForecast(
        model_id=m, target=replicas, evidence=evidence, canary=canary, reason=reason,
        observed_rate=st.observed, ewma=st.ewma, trend=st.slope, rate=st.rate,
        lookahead_seconds=st.lookahead, service_seconds=st.service,
        offered_concurrency=max(0.0, offered), direct_offered=direct.offered, workload_offered=wl_offered,
        inferred_rate=inf.rate if inf is not None else 0.0, inferred_offered=inf_offered,
        peak_rate=st.peak_rate, p95_ms=st.p95_ms, latency_slo_ms=p.latency_slo_ms, errors=st.errors,
        error_ratio=direct.error_ratio, queue=st.queue, requests=st.requests, ready=ready,
        last_seen=direct.last_seen, hold_until=direct.hold_until,
        workloads=tuple(claim.workloads) if claim is not None else (),
    )
    return target, row
