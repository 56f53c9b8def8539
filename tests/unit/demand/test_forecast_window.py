"""The forecast window on the log: a ForecastWindowSet changes the demand bucket, and with it every
window the forecast counts in buckets (the evidence gate's fifteen)."""

from __future__ import annotations

import pytest

from grid.demand import fold as dm
from grid.demand import outcomes as oc
from grid.demand.forecast import WORKLOAD_ADMITTED, forecast
from grid.events.control import DEFAULT_FORECAST_BUCKET_SECONDS, ForecastWindowSet

from tests.unit.demand.fc_helpers import T0, auto, fold, profile, rec, wrow

CONF = frozenset({"coder", "base"})
SHORT = 4.0


def catalog():  # type: ignore[no-untyped-def]
    return [profile("coder", workload_scores={"coding": 0.9}), profile("base", workload_scores={"general": 0.5})]


def window(seconds: float) -> ForecastWindowSet:
    return ForecastWindowSet(event_id=f"w{seconds}", at=0.0, bucket_seconds=seconds)


def _three_coding_requests(state: dm.DemandState, t: float) -> dm.DemandState:
    return fold(state, t, [auto("coding", served="base") for _ in range(3)], CONF)


def test_the_default_bucket_is_a_minute_and_the_same_length_changes_nothing() -> None:
    s = fold(dm.initial(), T0 + 1.0, [rec("base")], CONF)
    assert s.bucket_seconds == DEFAULT_FORECAST_BUCKET_SECONDS == 60.0
    before = s.models["base"].buckets[-1].count
    s = dm.apply(s, window(60.0), T0 + 2.0, CONF)
    assert s.models["base"].buckets[-1].count == before and s.newest is not None


def test_a_new_length_starts_the_bucketed_series_afresh_and_keeps_outcomes() -> None:
    s = _three_coding_requests(dm.initial(), T0 + 1.0)
    s = fold(s, T0 + 2.0, [rec("base")], CONF)
    assert oc.view(s.outcomes, "base", "coding", None, T0 + 3.0).samples == pytest.approx(3.0, rel=1e-3)

    s = dm.apply(s, window(SHORT), T0 + 3.0, CONF)
    # A minute's counts cannot be split into 4 s buckets: the series start empty.
    assert (s.bucket_seconds, s.newest, s.models, s.workloads) == (SHORT, None, {}, {})
    # Served-request evidence is timestamped, not bucketed: it stays.
    assert oc.view(s.outcomes, "base", "coding", None, T0 + 3.0).samples == pytest.approx(3.0, rel=1e-3)

    s = fold(s, T0 + 9.0, [rec("base")], CONF)
    assert [bk.index for bk in s.models["base"].buckets] == [int((T0 + 9.0) // SHORT)]


@pytest.mark.parametrize("seconds, held", [(DEFAULT_FORECAST_BUCKET_SECONDS, True), (SHORT, False)])
def test_the_evidence_gate_spans_fifteen_buckets_of_the_configured_length(seconds: float, held: bool) -> None:
    """Three `auto` coding requests admit the coding workload; two minutes later a one-minute
    bucket still holds them inside its 15-bucket gate, a 4 s bucket (a one-minute gate) does not."""
    s = dm.apply(dm.initial(), window(seconds), T0, CONF)
    s = _three_coding_requests(s, T0 + 1.0)
    assert wrow(forecast(s, catalog(), T0 + 2.0), "coding").status == WORKLOAD_ADMITTED
    later = wrow(forecast(s, catalog(), T0 + 120.0), "coding")
    assert (later.status == WORKLOAD_ADMITTED) is held, later


def test_the_event_bounds_the_length() -> None:
    import msgspec

    from grid.events import codec

    for bad in (0.0, 0.5, 3601.0):
        data = codec.encode(ForecastWindowSet(event_id="x", at=1.0, bucket_seconds=bad))
        with pytest.raises(codec.EventDecodeError):
            codec.decode(data)
    assert msgspec.json.decode(codec.encode(window(SHORT)))["bucket_seconds"] == SHORT
