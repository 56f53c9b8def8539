import math

import pytest

from grid.demand import fold as dm
from grid.demand.forecast import (
    REASON_BASELINE, REASON_ERRORS, REASON_HOLD, REASON_LATENCY, REASON_LOOKAHEAD, REASON_MAX,
    REASON_QUEUE, Forecast, forecast,
)
from grid.events.codec import encode_value
from grid.events.requests import RequestFeatures
from grid.fleet.planning import DemandTarget, PlannerInput, TimingSample

from tests.unit.demand.fc_helpers import BS, T0, at, auto, feed, fold, profile, rec, row, target

CONF = frozenset({"a", "b", "c"})


def steady(model="a", per_bucket=30, buckets=10, **kw):
    return feed(dm.initial(), model, [per_bucket] * buckets, CONF, **kw)


def test_headroom_from_target_utilization():
    # 30 requests/min x 2 s = 1.0 offered; 1.0 / (1 x 0.7) -> 2 replicas.
    s = steady(service_seconds=2.0)
    fc = forecast(s, [profile("a")], at(10, 0.0))
    r = row(fc, "a")
    assert r.observed_rate == pytest.approx(0.5)
    assert r.offered_concurrency == pytest.approx(1.0)
    assert target(fc, "a") == DemandTarget(
        model_id="a", replicas=2, evidence="direct", harm=target(fc, "a").harm,
        offered_concurrency=pytest.approx(1.0), reason="direct_load",
    )
    # Replica concurrency 4 at 0.7 carries 2.8 concurrent requests: one replica.
    assert target(forecast(s, [profile("a", replica_concurrency=4)], at(10, 0.0)), "a").replicas == 1
    # Full utilisation allowed: exactly 1.0 offered fits one replica.
    assert target(forecast(s, [profile("a", target_utilization=1.0)], at(10, 0.0)), "a").replicas == 1


def test_measured_service_time_blends_with_the_prior():
    s = steady(service_seconds=6.0)
    r = row(forecast(s, [profile("a", expected_service_seconds=1.0)], at(10, 0.0)), "a")
    assert r.service_seconds == pytest.approx(6.0)  # 300 measurements: fully measured
    s1 = feed(dm.initial(), "a", [4], CONF, service_seconds=6.0)
    r1 = row(forecast(s1, [profile("a", expected_service_seconds=1.0)], at(1, 0.0)), "a")
    assert r1.service_seconds == pytest.approx(0.5 * 6.0 + 0.5 * 1.0)  # 4 of 8 samples


def test_min_and_max_bounds():
    idle = dm.initial()
    t = target(forecast(idle, [profile("a", min_replicas=3, max_replicas=5)], at(0)), "a")
    assert (t.replicas, t.evidence, t.reason) == (3, "baseline", REASON_BASELINE)
    hot = steady(per_bucket=600, service_seconds=10.0)
    t = target(forecast(hot, [profile("a", max_replicas=2)], at(10, 0.0)), "a")
    assert t.replicas == 2 and REASON_MAX in t.reason.split("+")
    # max_replicas 0 disables the model entirely.
    assert target(forecast(hot, [profile("a", max_replicas=0)], at(10, 0.0)), "a") is None


def test_queue_pressure_asks_one_beyond_ready():
    s = steady(per_bucket=6, queue_depth=2)
    fc = forecast(s, [profile("a")], at(10, 0.0), ready_replicas={"a": 3})
    t = target(fc, "a")
    assert REASON_QUEUE in t.reason.split("+") and t.replicas == 4
    assert t.harm.queue == pytest.approx(2.0)


def test_latency_pressure_uses_request_level_p95():
    slow = fold(dm.initial(), at(9), [rec("a", service_seconds=3.0) for _ in range(10)], CONF)
    fc = forecast(slow, [profile("a", latency_slo_ms=1000.0)], at(10, 0.0), ready_replicas={"a": 1})
    assert REASON_LATENCY in target(fc, "a").reason and target(fc, "a").replicas == 2
    assert target(fc, "a").harm.latency_ratio > 2.5
    # One slow outlier among 99 fast requests is tail evidence, not a slow minute.
    mixed = fold(dm.initial(), at(9), [rec("a", service_seconds=0.1) for _ in range(99)]
                 + [rec("a", service_seconds=30.0)], CONF)
    fc = forecast(mixed, [profile("a", latency_slo_ms=1000.0)], at(10, 0.0), ready_replicas={"a": 1})
    assert REASON_LATENCY not in target(fc, "a").reason
    assert row(fc, "a").p95_ms < 150.0


def test_capacity_errors_are_pressure_but_bad_requests_are_not():
    errs = [rec("a", outcome="unavailable", status_code=503, service_seconds=0.0) for _ in range(3)]
    s = fold(dm.initial(), at(9), [rec("a") for _ in range(7)] + errs, CONF)
    fc = forecast(s, [profile("a")], at(10, 0.0), ready_replicas={"a": 2})
    t = target(fc, "a")
    assert REASON_ERRORS in t.reason and t.replicas == 3 and t.harm.errors == 3.0
    bad = [rec("a", outcome="error", status_code=400) for _ in range(3)]
    s = fold(dm.initial(), at(9), [rec("a") for _ in range(7)] + bad, CONF)
    t = target(forecast(s, [profile("a")], at(10, 0.0), ready_replicas={"a": 2}), "a")
    assert REASON_ERRORS not in t.reason


def test_pressure_is_only_recent():
    s = feed(dm.initial(), "a", [5], CONF, queue_depth=4)
    fc = forecast(s, [profile("a", scale_down_cooldown_seconds=0.0)], at(5, 0.0), ready_replicas={"a": 1})
    assert REASON_QUEUE not in row(fc, "a").reason


def test_positive_trend_and_cold_start_lookahead():
    rising = feed(dm.initial(), "a", [6, 12, 18, 24, 30, 36], CONF)
    p = profile("a", max_replicas=100)
    quick = row(forecast(rising, [p], at(6, 0.0), fastest_start_seconds={"a": 0.0}), "a")
    slow = row(forecast(rising, [p], at(6, 0.0), fastest_start_seconds={"a": 240.0}), "a")
    capped = row(forecast(rising, [p], at(6, 0.0), fastest_start_seconds={"a": 3600.0}), "a")
    # Positive trend term: one bucket ahead even with an instant start.
    assert quick.trend == pytest.approx(0.1 / BS)
    assert quick.rate > quick.observed_rate
    assert slow.rate > quick.rate
    assert REASON_LOOKAHEAD in slow.reason
    assert capped.lookahead_seconds == 300.0
    # Never more than 2x the observed level.
    for r in (quick, slow, capped):
        assert r.rate <= 2.0 * r.observed_rate + 1e-12


def test_lookahead_uses_profile_or_learned_timings():
    rising = feed(dm.initial(), "a", [6, 12, 18, 24, 30, 36], CONF)
    p = profile("a", load_seconds=100.0, warm_seconds=20.0, artifact_sha256="s1")
    assert row(forecast(rising, [p], at(6, 0.0)), "a").lookahead_seconds == 120.0
    learned = (
        TimingSample(host_id="h1", model_id="a", artifact_sha256="s1", load_seconds=10.0, warm_seconds=5.0, samples=4),
        TimingSample(host_id="h2", model_id="a", artifact_sha256="s1", load_seconds=1.0, warm_seconds=1.0, samples=3),
        TimingSample(host_id="h3", model_id="a", artifact_sha256="old", load_seconds=1.0, warm_seconds=1.0, samples=9),
    )
    assert row(forecast(rising, [p], at(6, 0.0), timings=learned), "a").lookahead_seconds == 15.0


def test_steep_noise_is_capped_at_twice_the_level():
    spike = feed(dm.initial(), "a", [1, 1, 1, 1, 1, 600], CONF)
    r = row(forecast(spike, [profile("a", max_replicas=1000)], at(6, 0.0), fastest_start_seconds={"a": 300.0}), "a")
    assert r.rate <= 2.0 * r.observed_rate + 1e-12


def test_negative_trend_never_accelerates_scale_down():
    falling = feed(dm.initial(), "a", [36, 30, 24, 18, 12, 6], CONF)
    r = row(forecast(falling, [profile("a")], at(6, 0.0)), "a")
    assert r.trend < 0
    assert r.rate == r.observed_rate == r.ewma


def test_cooldown_holds_recent_ready_replicas():
    s = feed(dm.initial(), "a", [60], CONF)  # demand in bucket 0 only: 2.0 offered -> 3 replicas
    p = profile("a", scale_down_cooldown_seconds=600.0)
    fc = forecast(s, [p], at(5), ready_replicas={"a": 3})
    t = target(fc, "a")
    assert (t.replicas, t.evidence) == (3, "direct") and REASON_HOLD in t.reason
    # A replica that demand inside the window never justified is not held: the hold judges
    # the peak at the scale-down band (2.0 offered / (0.7 x 0.7) -> 5), never beyond it.
    assert target(forecast(s, [p], at(5), ready_replicas={"a": 7}), "a").replicas == 5
    assert row(fc, "a").hold_until == at(0) + 600.0
    assert target(forecast(s, [p], at(11), ready_replicas={"a": 3}), "a") is None


def test_persisted_watermark_survives_a_restart():
    empty = dm.initial()  # e.g. a controller that restarted without a demand snapshot
    p = profile("a", scale_down_cooldown_seconds=600.0)
    now = T0 + 5_000.0
    t = target(forecast(empty, [p], now, ready_replicas={"a": 2}, watermarks={"a": now - 120.0}), "a")
    assert (t.replicas, t.reason) == (2, REASON_HOLD)
    t = target(forecast(empty, [p], now, ready_replicas={"a": 0}, watermarks={"a": now - 120.0}), "a")
    assert t.replicas == 1
    assert target(forecast(empty, [p], now, ready_replicas={"a": 2}, watermarks={"a": now - 601.0}), "a") is None


def test_router_fallback_never_becomes_direct_demand():
    s = fold(dm.initial(), at(0), [auto("general", served="a") for _ in range(50)], CONF)
    fc = forecast(s, [profile("a")], at(1, 0.0), ready_replicas={"a": 1})
    assert target(fc, "a") is None  # "a" has no workload scores: no candidate
    assert row(fc, "a").observed_rate == 0.0 and row(fc, "a").last_seen is None


def test_retired_models_get_no_target_or_row():
    s = steady()
    fc = forecast(s, [profile("a", min_replicas=1), profile("b", min_replicas=1)], at(10), retired=frozenset({"a"}))
    assert [t.model_id for t in fc.targets] == ["b"] and [r.model_id for r in fc.models] == ["b"]


def test_targets_sorted_deterministic_and_feed_the_planner():
    s = dm.initial()
    for m in ("c", "a", "b"):
        s = feed(s, m, [10, 10], CONF)
    profiles = [profile("c"), profile("b"), profile("a")]
    fc = forecast(s, profiles, at(2))
    assert [t.model_id for t in fc.targets] == ["a", "b", "c"]
    again = forecast(dm.decode_state(dm.encode_state(s)), list(reversed(profiles)), at(2))
    assert encode_value(fc) == encode_value(again)
    pin = PlannerInput(now=at(2), profiles=tuple(profiles), hosts=(), demand=fc.targets)
    assert encode_value(pin)
    assert isinstance(fc, Forecast)


def test_no_demand_means_no_target_and_finite_rows():
    fc = forecast(dm.initial(), [profile("a")], at(0))
    assert fc.targets == ()
    r = row(fc, "a")
    assert r.reason == "idle" and r.target == 0 and all(
        math.isfinite(v) for v in (r.rate, r.offered_concurrency, r.queue))


def test_partial_current_bucket_counts_a_burst():
    s = fold(dm.initial(), at(0, 10.0), [rec("a") for _ in range(120)], CONF)
    r = row(forecast(s, [profile("a", max_replicas=50)], at(0, 40.0)), "a")
    assert r.observed_rate == pytest.approx(120 / 40.0)
    assert r.target == math.ceil(3.0 * 2.0 / 0.7)
    assert isinstance(RequestFeatures, type)


def test_scale_down_waits_for_the_cooldown_window_not_for_silence():
    # 60/min x 2 s = 2.0 offered -> 3 replicas; then 6/min -> 1 replica, traffic never stops.
    s = feed(dm.initial(), "a", [60] * 5 + [6] * 15, CONF)
    p = profile("a", scale_down_cooldown_seconds=600.0)
    early = target(forecast(s, [p], at(12, 0.0), ready_replicas={"a": 3}), "a")
    assert early.replicas == 3 and REASON_HOLD in early.reason  # bucket 4 is inside the window
    late = target(forecast(s, [p], at(20, 0.0), ready_replicas={"a": 3}), "a")
    assert late.replicas == 1


def test_pressure_counts_only_replicas_that_were_serving_when_it_was_measured():
    errs = [rec("a", outcome="unavailable", status_code=503, service_seconds=0.0) for _ in range(3)]
    s = fold(dm.initial(), at(9), [rec("a") for _ in range(7)] + errs, CONF)
    # Two replicas ready now, but the second became ready after the pressure began (bucket 9):
    # the pressure already caused it, so it asks for one beyond the one that was serving.
    late = forecast(s, [profile("a")], at(10, 0.0), ready_replicas={"a": 2},
                    ready_since={"a": (at(0), at(9, 30.0))})
    assert REASON_ERRORS in target(late, "a").reason and target(late, "a").replicas == 2
    # Both serving before the pressure (or unknown): one beyond both.
    early = forecast(s, [profile("a")], at(10, 0.0), ready_replicas={"a": 2}, ready_since={"a": (None, at(0))})
    assert target(early, "a").replicas == 3
