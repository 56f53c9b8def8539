"""The dashboard's charts: analytics rows (from a real DuckDB store) in, bounded series out.

Events go through the real analytics sink into an in-memory DuckDB store; the history views the
controller serves ("demand", "memory") read them; `build_charts` turns the rows into series.
"""

from __future__ import annotations

from typing import Any

import duckdb
import msgspec
import pytest

from grid.analytics.history import HistoryParams, run_view
from grid.analytics.sink import AnalyticsSink, open_store
from grid.dashboard import charts
from grid.dashboard.charts import ForecastSample, build_charts, encode_charts, window_for
from grid.events import codec
from grid.events.base import Event
from grid.events.host import Residency
from grid.events.log import StoredMessage
from grid.events.requests import RequestBatch, RequestFeatures
from grid.events.subjects import HOSTS_STREAM, REQUESTS_STREAM, subject_for
from tests import heartbeats

NOW = 1_800_003_600.0
START, END, BUCKET = window_for(NOW, 3600.0)


def _store(events: list[tuple[str, Event]]) -> duckdb.DuckDBPyConnection:
    con = open_store(":memory:")
    sink = AnalyticsSink(con)
    seqs: dict[str, int] = {}
    for stream, event in events:
        seqs[stream] = seqs.get(stream, 0) + 1
        sink.add(StoredMessage(stream=stream, seq=seqs[stream], subject=subject_for(event),
                               data=codec.encode(event), time=event.at))
    sink.flush()
    return con


def _requests(at: float, model: str, n: int, *, errors: int = 0, seconds: float = 0.2) -> tuple[str, Event]:
    records = tuple(RequestFeatures(endpoint="chat", requested_model=model, served_model=model, host_id="h1",
                                    service_seconds=seconds * (1 + i), finished_at=at,
                                    outcome="error" if i < errors else "ok",
                                    status_code=502 if i < errors else 200)
                    for i in range(n))
    return REQUESTS_STREAM, RequestBatch(event_id=f"b-{model}-{at}", at=at, source="gw", records=records)


def _heartbeat(at: float, host: str, *residencies: Residency) -> tuple[str, Event]:
    return HOSTS_STREAM, heartbeats.heartbeat(host, *residencies, event_id=f"hb-{host}-{at}", at=at, capacity_mb=8000)


def _views(con: duckdb.DuckDBPyConnection) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    params = HistoryParams(start=START, end=END, bucket_seconds=BUCKET)
    return run_view(con, "demand", params), run_view(con, "memory", params)


def _chart(view: charts.ChartsView, chart_id: str) -> charts.Chart:
    (chart,) = [c for c in view.charts if c.id == chart_id]
    return chart


def test_window_is_aligned_and_bounded() -> None:
    start, end, bucket = window_for(NOW + 17.0, 3600.0)
    assert bucket == 60.0 and end - start == 3600.0 and end % bucket == 0 and start <= NOW + 17.0 < end
    assert window_for(NOW, 10.0)[1] - window_for(NOW, 10.0)[0] == charts.MIN_WINDOW_SECONDS
    assert window_for(NOW, 1e9)[1] - window_for(NOW, 1e9)[0] == charts.MAX_WINDOW_SECONDS


def test_requests_latency_errors_and_memory_from_the_store() -> None:
    t1, t2 = START + 65.0, START + 610.0
    con = _store([
        _requests(t1, "m1", 4, errors=1), _requests(t2, "m1", 2), _requests(t2, "m2", 1),
        _heartbeat(t1, "h1", Residency(model_id="m1", memory_mb=700, state="ready"),
                   Residency(model_id="m2", memory_mb=300, state="cached")),
        _heartbeat(t2, "h1"),  # nothing resident: a point at zero, not a gap
        _requests(START - 600.0, "m1", 9),  # before the window
    ])
    demand, memory = _views(con)
    view = build_charts(demand, memory, (), now=NOW, start=START, end=END, bucket_seconds=BUCKET)
    b1, b2 = (t // BUCKET * BUCKET for t in (t1, t2))
    requests = {s.name: s.points for s in _chart(view, "requests").series}
    assert requests == {"m1": (charts.Point(b1, 4.0), charts.Point(b2, 2.0)), "m2": (charts.Point(b2, 1.0),)}
    assert {s.name: [p.v for p in s.points] for s in _chart(view, "errors").series} == {"m1": [1.0, 0.0], "m2": [0.0]}
    latency = {(s.name, s.measure): s.points for s in _chart(view, "latency").series}
    assert set(latency) == {("m1", "p50"), ("m1", "p95"), ("m2", "p50"), ("m2", "p95")}
    assert latency[("m1", "p50")][0] == charts.Point(b1, 0.5) and latency[("m1", "p95")][0].v > 0.5
    (host,) = _chart(view, "memory").series
    assert host.name == "h1" and host.points == (charts.Point(b1, 700.0), charts.Point(b2, 0.0))
    # Demand without a forecast sample: observed req/s only.
    demand_series = {(s.name, s.measure): s.points for s in _chart(view, "demand").series}
    assert demand_series[("m1", "observed")][0] == charts.Point(b1, round(4 / BUCKET, 6))
    assert ("m1", "forecast") not in demand_series
    assert msgspec.json.decode(encode_charts(view))["charts"][0]["series"][0]["points"][0] == [b1, 4.0]


def test_demand_is_drawn_against_the_sampled_forecast() -> None:
    t = START + 125.0
    demand, memory = _views(_store([_requests(t, "m1", 6)]))
    samples = (ForecastSample(START - 30.0, {"m1": 9.0}),  # before the window: not drawn
               ForecastSample(t, {"m1": 0.05}), ForecastSample(t + 15.0, {"m1": 0.1, "idle": 0.0}))
    view = build_charts(demand, memory, samples, now=NOW, start=START, end=END, bucket_seconds=BUCKET)
    series = {(s.name, s.measure): s.points for s in _chart(view, "demand").series}
    bucket = t // BUCKET * BUCKET
    assert series[("m1", "observed")] == (charts.Point(bucket, 0.1),)
    # The last forecast of each bucket; a model forecast at zero and never requested is a flat line.
    assert series[("m1", "forecast")] == (charts.Point(bucket, 0.1),)
    assert series[("idle", "forecast")] == (charts.Point(bucket, 0.0),)
    assert ("idle", "observed") not in series
    assert _chart(view, "demand").note == charts.FORECAST_NOTE
    assert [s.name for s in _chart(view, "requests").series] == ["m1"]


def test_many_models_keep_the_busiest_and_name_the_rest() -> None:
    t = START + 5.0
    events = [_requests(t, f"model-{i:02d}", i + 1) for i in range(12)]
    events += [_heartbeat(t, f"host-{i:02d}", Residency(model_id="x", memory_mb=100 * (i + 1), state="ready"))
               for i in range(9)]
    demand, memory = _views(_store(events))
    view = build_charts(demand, memory, (), now=NOW, start=START, end=END, bucket_seconds=BUCKET, top=4)
    requests = _chart(view, "requests")
    assert [s.name for s in requests.series] == ["model-08", "model-09", "model-10", "model-11"]
    assert requests.omitted == tuple(f"model-{i:02d}" for i in range(7, -1, -1))
    assert len(_chart(view, "latency").series) == 8
    memory_chart = _chart(view, "memory")
    assert [s.name for s in memory_chart.series] == ["host-05", "host-06", "host-07", "host-08"]
    assert len(memory_chart.omitted) == 5
    top_bound = build_charts(demand, memory, (), now=NOW, start=START, end=END, bucket_seconds=BUCKET, top=10_000)
    assert len(_chart(top_bound, "requests").series) == 12  # top is clamped to MAX_TOP (20)


def test_no_data_yields_charts_without_series() -> None:
    demand, memory = _views(_store([]))
    view = build_charts(demand, memory, (), now=NOW, start=START, end=END, bucket_seconds=BUCKET)
    assert [c.id for c in view.charts] == ["requests", "latency", "errors", "demand", "memory"]
    assert all(c.series == () and c.omitted == () for c in view.charts) and view.reason == charts.REASON_OK
    off = charts.unavailable(charts.REASON_NO_HISTORY, "no store", now=NOW, start=START, end=END, bucket_seconds=BUCKET)
    assert off.charts == () and off.reason == charts.REASON_NO_HISTORY


@pytest.mark.parametrize("top", [1, 3])
def test_same_rows_same_bytes(top: int) -> None:
    demand, memory = _views(_store([_requests(START + 1.0, "a", 2), _requests(START + 1.0, "b", 2)]))
    one = build_charts(demand, memory, (), now=NOW, start=START, end=END, bucket_seconds=BUCKET, top=top)
    two = build_charts(list(reversed(demand)), memory, (), now=NOW, start=START, end=END, bucket_seconds=BUCKET, top=top)
    assert encode_charts(one) == encode_charts(two)
    assert [s.name for s in _chart(one, "requests").series] == ["a", "b"][:top]
