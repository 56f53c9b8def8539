"""Offered concurrency -> replicas: a replica's capacity at its target utilization, and the
largest need of any recent bucket (what hysteresis holds)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from grid.demand.fold import DemandState, Series
from grid.demand.forecast.series import finite
from grid.demand.forecast.types import ForecastConfig
from grid.events.control import ModelProfile


def replica_capacity(p: ModelProfile) -> float:
    util = finite(p.target_utilization, 0.7)
    util = min(1.0, max(0.05, util))
    return max(1, p.replica_concurrency) * util


def hold_fraction(cfg: ForecastConfig) -> float:
    return min(1.0, max(0.1, finite(cfg.hold_band, 1.0)))


def replicas_for(offered: float, cap: float, cfg: ForecastConfig) -> int:
    if not offered >= cfg.min_offered:
        return 0
    return max(1, math.ceil(offered / cap - 1e-9))


def peak_need(
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
        need = replicas_for(offered, cap, cfg)
        peak = need if peak is None else max(peak, need)
    return peak


def workload_peak_need(
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
    return max((replicas_for(v, cap, cfg) for v in offered.values()), default=0)
