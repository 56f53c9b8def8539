"""Direct demand: named-model requests, per model.

Each model's series statistics (series.py) become replicas: ``ceil(offered / (replica_concurrency
x target_utilization))``. Queue (>= 0.5), latency (approximate p95 above ``latency_slo_ms`` with
>= 3 samples) or capacity-error (>= 5 % of recent requests) pressure asks for at least one
replica beyond the ready replicas that were already serving when the pressure began
(``ready_since``): a replica that became ready after it already answers it.

Hysteresis: while the demand watermark (latest of the projection's ``last_seen`` and the
persisted ``watermarks``) is within ``scale_down_cooldown_seconds``, the ready replicas that
demand justified during that window (at least one) stay desired (``cooldown_hold``); holds
judge the window's peak at ``hold_band`` x the scale-up utilization (a band: demand hovering
at a replica boundary keeps the replica instead of releasing it and starting it again minutes
later). With only a watermark and no bucket history (a controller restart) every ready
replica stays desired. Direct demand whose watermark is older than the cooldown (or one
bucket) desires nothing: a decaying EWMA tail never keeps a model loaded past its cooldown.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import msgspec

from grid.demand.fold import DemandState, Series
from grid.demand.forecast.reasons import (
    REASON_DIRECT,
    REASON_ERRORS,
    REASON_HOLD,
    REASON_LATENCY,
    REASON_LOOKAHEAD,
    REASON_QUEUE,
)
from grid.demand.forecast.series import SeriesStats, finite, series_stats
from grid.demand.forecast.sizing import hold_fraction, peak_need, replica_capacity, replicas_for
from grid.demand.forecast.types import ForecastConfig
from grid.events.control import ModelProfile


def direct_demand(
    demand: DemandState, live: Sequence[ModelProfile], starts: Mapping[str, float], now: float, cfg: ForecastConfig,
) -> dict[str, SeriesStats]:
    """Rate, trend, service time and pressure of each model's named-model requests."""
    stats: dict[str, SeriesStats] = {}
    for p in live:
        prior = finite(p.expected_service_seconds, 2.0)
        stats[p.model_id] = series_stats(demand.models.get(p.model_id), demand, now, prior, starts[p.model_id], cfg)
    return stats


class DirectNeed(msgspec.Struct, kw_only=True):
    replicas: int
    offered: float
    reasons: list[str]
    latency_ratio: float
    error_ratio: float
    last_seen: float | None
    hold_until: float | None


def direct_need(
    p: ModelProfile, st: SeriesStats, series: Series | None, demand: DemandState, now: float, ready: int,
    watermark: float | None, cfg: ForecastConfig, since: Sequence[float | None] | None = None,
) -> DirectNeed:
    """Replicas direct demand asks for: load, pressure beyond the ready set, cooldown hold."""
    cap = replica_capacity(p)
    reasons: list[str] = []
    # Staleness: direct demand older than the cooldown no longer desires anything.
    last_seen = series.last_seen if series is not None else None
    if watermark is not None and math.isfinite(watermark) and (last_seen is None or watermark > last_seen):
        last_seen = watermark
    cooldown = max(0.0, finite(p.scale_down_cooldown_seconds))
    fresh = last_seen is not None and now - last_seen <= max(cooldown, demand.bucket_seconds)
    direct_offered = st.offered if fresh else 0.0
    need = replicas_for(direct_offered, cap, cfg)
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
        peak = peak_need(series, demand, now, cooldown, st.service, cap * hold_fraction(cfg), cfg)
        hold = max(1, ready if peak is None else min(ready, peak))
        if hold > need:
            need = hold
            reasons.append(REASON_HOLD)
    return DirectNeed(replicas=need, offered=direct_offered, reasons=reasons, latency_ratio=latency_ratio,
                       error_ratio=error_ratio, last_seen=last_seen, hold_until=hold_until)
