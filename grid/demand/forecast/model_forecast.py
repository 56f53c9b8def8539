"""One model's target and row: direct, workload and inferred demand combined.

Direct demand (with whatever workload demand it also claims) outranks inferred-only demand;
workload and correlation demand alone are ``evidence="inferred"`` and a weak workload claim
is a one-replica canary. Ready replicas that claimed workloads justified within
``scale_down_cooldown_seconds`` stay desired (``cooldown_hold``), so replicas justified by
``auto`` traffic do not flap on small dips. Everything is bounded by
``[min_replicas, max(max_replicas, min_replicas)]``; the reasons are joined into the row.
"""

from __future__ import annotations

from collections.abc import Sequence

from grid.demand import correlation as correlation_mod
from grid.demand.fold import DemandState
from grid.demand.forecast.direct_demand import direct_need
from grid.demand.forecast.reasons import (
    REASON_BASELINE,
    REASON_CANARY,
    REASON_CORRELATION,
    REASON_EXPLORE,
    REASON_HOLD,
    REASON_IDLE,
    REASON_MAX,
    REASON_WORKLOAD,
)
from grid.demand.forecast.series import SeriesStats, finite
from grid.demand.forecast.sizing import hold_fraction, replica_capacity, replicas_for, workload_peak_need
from grid.demand.forecast.types import ForecastConfig, ModelForecast
from grid.demand.forecast.workload_demand import WorkloadClaim
from grid.events.control import ModelProfile
from grid.fleet.planning import DemandTarget, Harm


def model_forecast(
    p: ModelProfile,
    st: SeriesStats,
    claim: WorkloadClaim | None,
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
    cap = replica_capacity(p)
    direct = direct_need(p, st, demand.models.get(m), demand, now, ready, watermark, cfg, since)
    reasons = direct.reasons
    inf_offered = inf.rate * st.service if inf is not None else 0.0
    inf_need = max(1, replicas_for(inf_offered, cap, cfg)) if inf is not None else 0
    wl_offered = claim.offered if claim is not None else 0.0
    evidence = ""
    canary = False
    offered = 0.0
    if direct.replicas:
        offered = direct.offered + wl_offered
        replicas = max(direct.replicas, replicas_for(offered, cap, cfg))
        evidence = "direct"
        if claim is not None:
            reasons.extend(f"{REASON_WORKLOAD}:{w}" for w in claim.workloads)
            reasons.extend(f"{REASON_EXPLORE}:{w}" for w in claim.explore)
    elif claim is not None or inf is not None:
        wl_need = 0
        if claim is not None:
            wl_need = 1 if claim.canary else max(1, replicas_for(wl_offered, cap, cfg))
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
        cooldown = max(0.0, finite(p.scale_down_cooldown_seconds))
        peak = workload_peak_need(claim.workloads, demand, now, cooldown, finite(p.expected_service_seconds, 2.0),
                                  cap * hold_fraction(cfg), cfg)
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
