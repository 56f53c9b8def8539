"""Statistics of one bucketed demand series (a model's named requests, or a workload's).

* rate: a bucketed EWMA (alpha 0.3) over the complete buckets since the series' first bucket in
  the window; the current, incomplete bucket counts as ``count / max(elapsed, bucket/2)`` when
  that is higher. ``observed`` is this level.
* trend: least-squares slope over the last six complete buckets. Only a positive slope is used
  (negative trends never accelerate scale-down), confidence-weighted by the share of those
  buckets that saw traffic. The forecast adds ``slope * max(bucket, lookahead) * confidence``
  where lookahead is the fastest eligible load+warm path capped at five minutes, and the total
  never exceeds 2x the observed level.
* offered concurrency = forecast rate x measured service time (blended with the profile's
  ``expected_service_seconds`` until eight measurements) + mean reported queue depth over the
  current and previous bucket.
* pressure evidence (queue, approximate p95 latency, capacity errors) from the recent buckets,
  and when it began.
"""

from __future__ import annotations

import math

import msgspec

from grid.demand.fold import Bucket, DemandState, Series, percentile_ms
from grid.demand.forecast.types import ForecastConfig


class SeriesStats(msgspec.Struct, kw_only=True):
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


def finite(x: float, default: float = 0.0) -> float:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else default


def series_stats(
    series: Series | None,
    demand: DemandState,
    now: float,
    prior_service: float,
    start_seconds: float,
    cfg: ForecastConfig,
    fast_up: bool = False,
) -> SeriesStats:
    st = SeriesStats()
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
