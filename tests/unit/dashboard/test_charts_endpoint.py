"""/api/charts: the dashboard reads the history views through its reader, bounded and cached, and says
why when it cannot."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from grid.analytics.history import HistoryParams, run_view
from grid.analytics.service import AnalyticsUnavailable
from grid.clock import SimulatedClock
from grid.dashboard import charts
from grid.dashboard.app import Dashboard, create_dashboard_app
from grid.events.host import Residency
from grid.events.log import InMemoryLog

from tests.unit.dashboard.test_charts import NOW, START, _heartbeat, _requests, _store


class StoreReader:
    """The history views of a real DuckDB store, counting reads."""

    def __init__(self, events: list[Any]) -> None:
        self.con = _store(events)
        self.reads: list[tuple[str, HistoryParams]] = []

    async def __call__(self, view: str, params: HistoryParams) -> list[dict[str, Any]]:
        self.reads.append((view, params))
        return run_view(self.con, view, params)


async def _get(dash: Dashboard, path: str, **params: Any) -> httpx.Response:
    app = create_dashboard_app(dash, token=None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dash") as client:
        return await client.get(path, params=params)


async def test_charts_from_the_store_are_bounded_and_cached() -> None:
    reader = StoreReader([_requests(START + 65.0, "m1", 3),
                          _heartbeat(START + 65.0, "h1", Residency(model_id="m1", memory_mb=512, state="ready"))])
    dash = Dashboard(InMemoryLog(), clock=SimulatedClock(NOW), history=reader)
    resp = await _get(dash, "/api/charts", window=3600, top=3)
    assert resp.status_code == 200 and resp.headers["cache-control"] == "no-store"
    body = resp.json()
    assert body["reason"] == "" and body["bucket_seconds"] == 60.0 and body["end"] - body["start"] == 3600.0
    by_id = {c["id"]: c for c in body["charts"]}
    assert by_id["requests"]["series"][0]["name"] == "m1"
    assert by_id["requests"]["series"][0]["points"] == [[START + 60.0, 3.0]]
    assert by_id["memory"]["series"][0]["points"] == [[START + 60.0, 512.0]]
    # The store was asked for exactly the window's buckets, once per view.
    assert [(v, p.bucket_seconds, p.end - p.start) for v, p in reader.reads] == [("demand", 60.0, 3600.0),
                                                                                 ("memory", 60.0, 3600.0)]
    # A second page within the cache interval costs no query.
    assert (await _get(dash, "/api/charts", window=3600, top=3)).content == resp.content
    assert len(reader.reads) == 2


@pytest.mark.parametrize("query", [{"window": "nan"}, {"window": "10"}, {"window": "1e9"}, {"top": "0"},
                                   {"top": "21"}, {"window": "x"}])
async def test_out_of_range_queries_are_refused(query: dict[str, str]) -> None:
    dash = Dashboard(InMemoryLog(), clock=SimulatedClock(NOW), history=StoreReader([]))
    resp = await _get(dash, "/api/charts", **query)
    assert resp.status_code == 422 and resp.json()["error"] == "bad_query"


async def test_without_a_store_the_charts_say_why() -> None:
    dash = Dashboard(InMemoryLog(), clock=SimulatedClock(NOW))
    body = (await _get(dash, "/api/charts")).json()
    assert body["reason"] == charts.REASON_NO_HISTORY and body["charts"] == []

    async def closed(view: str, params: HistoryParams) -> list[dict[str, Any]]:
        raise AnalyticsUnavailable("the analytics store is not open")

    dash = Dashboard(InMemoryLog(), clock=SimulatedClock(NOW), history=closed)
    body = (await _get(dash, "/api/charts")).json()
    assert body["reason"] == charts.REASON_HISTORY_UNAVAILABLE and body["charts"] == []
    assert body["detail"] == "AnalyticsUnavailable: the analytics store is not open"
