"""The demand view (`gridctl history demand`, status's recent demand) against the query it replaced.

The view computes its three latency quantiles with one list-valued quantile aggregate (each group
sorted once instead of three times); the answers must be the ones the three separate aggregates gave.
"""

from __future__ import annotations

import random
from typing import Any

import duckdb
import pytest

from grid.analytics import queries
from grid.analytics.sink import AnalyticsSink, open_store
from grid.events import codec
from grid.events.log import StoredMessage
from grid.events.requests import RequestCompleted, RequestFailed, RequestFeatures
from grid.events.subjects import REQUESTS_STREAM, subject_for

T0 = 1_800_000_000.0

# The query as it was before the list-valued quantile, kept here as the reference.
OLD_SQL = (
    "SELECT coalesce(served_model, requested_model) AS model, {bucket} AS bucket, count(*) AS requests, "
    "count(*) FILTER (WHERE outcome <> 'ok') AS errors, "
    "quantile_cont(service_seconds, 0.5) AS p50_seconds, "
    "quantile_cont(service_seconds, 0.95) AS p95_seconds, "
    "quantile_cont(service_seconds, 0.99) AS p99_seconds "
    "FROM request_features{where} GROUP BY ALL ORDER BY model, bucket"
)


def _old(con: duckdb.DuckDBPyConnection, start: float | None, end: float | None,
         bucket_seconds: float | None) -> list[dict[str, Any]]:
    where, params = queries._window(start, end)
    bucket = f"floor(time / {float(bucket_seconds)}) * {float(bucket_seconds)}" if bucket_seconds else "NULL"
    cur = con.execute(OLD_SQL.format(bucket=bucket, where=where), params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


@pytest.fixture(scope="module")
def store() -> duckdb.DuckDBPyConnection:
    rng = random.Random(15)
    con = open_store(":memory:")
    sink = AnalyticsSink(con)
    for i in range(4000):
        at = T0 + i * 7.3
        served = None if i % 13 == 0 else f"model-{rng.randrange(5)}"
        features = RequestFeatures(endpoint="chat", requested_model=f"model-{i % 5}", served_model=served,
                                   host_id="h1", service_seconds=round(rng.expovariate(2.0), 3),
                                   outcome="ok" if i % 7 else "engine_error", finished_at=at)
        event: Any = (RequestCompleted if i % 7 else RequestFailed)(event_id=f"e-{i}", at=at, features=features)
        sink.add(StoredMessage(stream=REQUESTS_STREAM, seq=i + 1, subject=subject_for(event),
                               data=codec.encode(event), time=at))
    sink.flush()
    return con


@pytest.mark.parametrize("start,end,bucket", [
    (None, None, None), (None, None, 300.0), (T0 + 3600, None, 300.0), (T0 + 1000, T0 + 9000, 60.0),
    (T0 + 20000, T0 + 20500, 0.0), (T0 + 10**7, None, 300.0),
])
def test_demand_matches_the_three_quantile_query(store: duckdb.DuckDBPyConnection, start: float | None,
                                                 end: float | None, bucket: float | None) -> None:
    new = queries.requests_per_model(store, start, end, bucket or None)
    old = _old(store, start, end, bucket or None)
    assert new == old  # exactly: same rows, same order, bit-identical quantiles
    if start is None or start < T0 + 10**6:
        assert new, "the window must hold requests for the comparison to mean anything"


def test_demand_sorts_each_group_once(store: duckdb.DuckDBPyConnection) -> None:
    where, params = queries._window(T0, None)
    plan = "\n".join(str(r[1]) for r in store.execute(
        "EXPLAIN " + queries.demand_sql(where, 300.0), params).fetchall())
    assert plan.count("quantile_cont(") == 1, plan
