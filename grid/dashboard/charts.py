"""The dashboard's charts: a pure function of analytics rows, forecast samples and `now`.

The page draws what arrives here (inline SVG, no computation): every series is a list of
(time, value) points already bucketed, each chart names its unit, and the number of series is
bounded (the busiest `top` models or hosts; the rest are named in `omitted`), so one answer
stays small however many models the grid serves.

Inputs are rows of the analytics store's history views (grid.analytics.history: "demand" per
model and bucket, "memory" per host and bucket) and the forecast rates the dashboard sampled
while it ran (the store records requests, not forecasts).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

CHARTS_VERSION = 1
# The window the page asks for by default, and the bounds of what it may ask.
DEFAULT_WINDOW_SECONDS = 3600.0
MIN_WINDOW_SECONDS = 300.0
MAX_WINDOW_SECONDS = 86400.0
# Buckets per window: one point a minute over the default hour.
BUCKETS_PER_WINDOW = 60
# Series per chart: the busiest models (by requests in the window) or hosts (by peak memory).
DEFAULT_TOP = 6
MAX_TOP = 20

# Why a chart answer holds no data (the page says so instead of drawing empty axes).
REASON_OK = ""
REASON_NO_HISTORY = "no_history"  # this dashboard runs beside no analytics store
REASON_HISTORY_UNAVAILABLE = "history_unavailable"  # the store is closed or failed this read

FORECAST_NOTE = "forecast: as this dashboard computed it while it ran (the store keeps requests, not forecasts)"


class Point(msgspec.Struct, frozen=True, array_like=True):
    t: float
    v: float


class Series(msgspec.Struct, frozen=True, kw_only=True):
    name: str  # the model or host id
    # What the line measures within its chart: "" (the chart's only measure), "p50"/"p95"
    # (latency), "observed"/"forecast" (demand).
    measure: str = ""
    points: tuple[Point, ...] = ()


class Chart(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    title: str
    unit: str
    series: tuple[Series, ...] = ()
    # Models or hosts with data in the window that did not make the top (busiest first).
    omitted: tuple[str, ...] = ()
    # What the reader should know about where the data comes from ("" when nothing).
    note: str = ""


class ChartsView(msgspec.Struct, frozen=True, kw_only=True):
    version: int = CHARTS_VERSION
    now: float
    start: float
    end: float
    bucket_seconds: float
    reason: str = REASON_OK
    detail: str = ""
    charts: tuple[Chart, ...] = ()


class ForecastSample(msgspec.Struct, frozen=True, array_like=True):
    """The forecast rate (req/s) per model at one moment, as the dashboard computed it."""

    at: float
    rates: dict[str, float]


def window_for(now: float, window_seconds: float) -> tuple[float, float, float]:
    """(start, end, bucket_seconds) of a chart window ending at `now`, aligned to whole buckets
    so consecutive answers put points at the same times."""
    window = min(MAX_WINDOW_SECONDS, max(MIN_WINDOW_SECONDS, window_seconds))
    bucket = window / BUCKETS_PER_WINDOW
    end = math.floor(now / bucket) * bucket + bucket
    return end - window, end, bucket


def _num(value: Any) -> float | None:
    if value is None:
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _ranked(totals: Mapping[str, float], top: int) -> tuple[list[str], tuple[str, ...]]:
    """The `top` names by total (ties by name), and the rest in the same order."""
    order = sorted(totals, key=lambda name: (-totals[name], name))
    return sorted(order[:top]), tuple(order[top:])


def _series(rows: Iterable[Mapping[str, Any]], key: str, column: str, names: Sequence[str], measure: str = "",
            scale: float = 1.0) -> list[Series]:
    by_name: dict[str, list[Point]] = {n: [] for n in names}
    for row in rows:
        points = by_name.get(row[key])
        value = _num(row.get(column))
        if points is None or value is None or row.get("bucket") is None:
            continue
        points.append(Point(float(row["bucket"]), round(value * scale, 6)))
    return [Series(name=n, measure=measure, points=tuple(sorted(by_name[n], key=lambda p: p.t))) for n in names]


def _forecast_series(samples: Sequence[ForecastSample], names: Sequence[str], start: float, end: float,
                     bucket: float) -> list[Series]:
    """The last forecast sampled in each bucket, per model."""
    last: dict[str, dict[float, float]] = {n: {} for n in names}
    for sample in samples:
        if not start <= sample.at < end:
            continue
        b = math.floor(sample.at / bucket) * bucket
        for name, per_bucket in last.items():
            rate = sample.rates.get(name)
            if rate is not None and math.isfinite(rate):
                per_bucket[b] = round(rate, 6)
    return [Series(name=n, measure="forecast", points=tuple(Point(t, v) for t, v in sorted(last[n].items())))
            for n in names]


def build_charts(
    demand_rows: Sequence[Mapping[str, Any]],
    memory_rows: Sequence[Mapping[str, Any]],
    forecast_samples: Sequence[ForecastSample],
    *,
    now: float,
    start: float,
    end: float,
    bucket_seconds: float,
    top: int = DEFAULT_TOP,
) -> ChartsView:
    """Requests, latency, errors and demand against forecast per model; memory per host (pure).

    `demand_rows` are the "demand" history view's rows (model, bucket, requests, errors,
    p50_seconds, p95_seconds) and `memory_rows` the "memory" view's (host, bucket, memory_mb),
    both bucketed by `bucket_seconds` over [start, end)."""
    top = min(MAX_TOP, max(1, top))
    demand = [r for r in demand_rows if r.get("model") is not None]
    requests: dict[str, float] = {}
    for r in demand:
        requests[r["model"]] = requests.get(r["model"], 0.0) + float(r.get("requests") or 0)
    for sample in forecast_samples:  # a model with a forecast and no request yet still shows
        for name in sample.rates:
            requests.setdefault(name, 0.0)
    models, models_omitted = _ranked(requests, top)
    served = [m for m in models if requests[m] > 0]

    peaks: dict[str, float] = {}
    for r in memory_rows:
        if r.get("host") is not None:
            peaks[r["host"]] = max(peaks.get(r["host"], 0.0), float(r.get("memory_mb") or 0))
    hosts, hosts_omitted = _ranked(peaks, top)

    per_bucket = f"per {bucket_seconds:g} s"
    latency = []
    for m in served:
        latency += _series(demand, "model", "p50_seconds", [m], "p50")
        latency += _series(demand, "model", "p95_seconds", [m], "p95")
    demand_vs_forecast = []
    observed = {s.name: s for s in _series(demand, "model", "requests", models, "observed", 1.0 / bucket_seconds)}
    for fc in _forecast_series(forecast_samples, models, start, end, bucket_seconds):
        demand_vs_forecast += [observed[fc.name], fc]
    charts = (
        Chart(id="requests", title="Requests per model", unit=f"requests {per_bucket}",
              series=tuple(_series(demand, "model", "requests", served)), omitted=models_omitted),
        Chart(id="latency", title="Latency per model (p50, p95)", unit="seconds", series=tuple(latency),
              omitted=models_omitted),
        Chart(id="errors", title="Errors per model", unit=f"errors {per_bucket}",
              series=tuple(_series(demand, "model", "errors", served)), omitted=models_omitted),
        Chart(id="demand", title="Demand against forecast per model", unit="requests per second",
              series=tuple(s for s in demand_vs_forecast if s.points), omitted=models_omitted,
              note=FORECAST_NOTE),
        Chart(id="memory", title="Resident memory per host", unit="MiB",
              series=tuple(_series(memory_rows, "host", "memory_mb", hosts)), omitted=hosts_omitted),
    )
    # A chart whose every series is empty says "no data yet" rather than drawing bare axes.
    charts = tuple(c if any(s.points for s in c.series) else msgspec.structs.replace(c, series=())
                   for c in charts)
    return ChartsView(now=now, start=start, end=end, bucket_seconds=bucket_seconds, charts=charts)


def unavailable(reason: str, detail: str, *, now: float, start: float, end: float,
                bucket_seconds: float) -> ChartsView:
    """A chart answer without data, saying why."""
    return ChartsView(now=now, start=start, end=end, bucket_seconds=bucket_seconds, reason=reason, detail=detail)


_encoder = msgspec.json.Encoder(order="deterministic")


def encode_charts(view: ChartsView) -> bytes:
    return _encoder.encode(view)
