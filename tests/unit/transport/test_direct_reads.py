"""A direct get's receipt time is the one a consumer's delivery gives (integer ns / 1e9)."""

from __future__ import annotations

import datetime as dt

from hypothesis import given
from hypothesis import strategies as st

from grid.transport.direct_reads import stored_time


def _rfc3339_nano(ns: int) -> str:
    # As nats-server writes `Nats-Time-Stamp` (Go's RFC3339Nano: trailing zeros of the fraction cut).
    whole = dt.datetime.fromtimestamp(ns // 1_000_000_000, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f"{ns % 1_000_000_000:09d}".rstrip("0")
    return f"{whole}.{fraction}Z" if fraction else f"{whole}Z"


@given(st.integers(min_value=0, max_value=4_102_444_800 * 1_000_000_000))
def test_a_stamp_reads_as_a_consumers_delivery_time(ns: int) -> None:
    assert stored_time(_rfc3339_nano(ns)) == ns / 1e9


def test_a_stamp_from_the_server() -> None:
    assert stored_time("2026-12-07T18:27:12.808260337Z") == 1796668032808260337 / 1e9
    assert stored_time("2026-12-07T18:27:12Z") == 1796668032.0
