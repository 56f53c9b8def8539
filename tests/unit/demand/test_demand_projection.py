import time

import msgspec
import pytest

from grid.events.codec import encode_value
from grid.events.control import ModeSet
from grid.events.requests import RequestBatch, RequestFeatures
from grid.demand import fold as dm
from grid.demand.fold import DemandState, bucket_offered, percentile_ms

from tests.unit.demand.fc_helpers import BS, T0, at, auto, completed, failed, fold, rec

CONF = frozenset({"a", "b"})


def test_counts_errors_queue_and_offered_concurrency_per_bucket():
    s = dm.initial()
    s = fold(s, at(0), [rec("a", service_seconds=4.0, queue_depth=2) for _ in range(30)], CONF)
    s = dm.apply(s, failed(rec("a", outcome="unavailable", status_code=503, service_seconds=0.0)), at(0, 30), CONF)
    s = dm.apply(s, completed(rec("b", service_seconds=1.0)), at(1), CONF)
    bk = s.models["a"].by_index()[int(at(0) // BS)]
    assert (bk.count, bk.errors, bk.pressure_errors, bk.service_n) == (31, 1, 1, 30)
    # 31 arrivals in 60 s x 4 s mean service + mean reported queue depth 60/31.
    assert bucket_offered(bk, BS) == pytest.approx(31 / 60 * 4.0 + 60 / 31)
    assert s.models["b"].by_index()[int(at(1) // BS)].count == 1
    assert s.models["a"].last_seen == at(0, 30)


def test_request_level_p95_keeps_one_outlier_as_tail_only():
    s = dm.initial()
    s = fold(s, at(0), [rec("a", service_seconds=0.1) for _ in range(99)] + [rec("a", service_seconds=30.0)], CONF)
    bk = s.models["a"].by_index()[int(at(0) // BS)]
    p95 = percentile_ms([bk])
    assert 85.0 < p95 < 120.0  # about 100 ms, within one histogram bin
    assert percentile_ms([bk], 1.0) > 25_000.0  # the outlier is still tail evidence
    assert len(bk.hist) <= dm.HIST_BINS


def test_histogram_is_bounded_for_extreme_latencies():
    s = dm.initial()
    lat = [1e-6, 0.0005, 1.0, 1e3, 8e4, 1e9, float("inf"), float("nan"), -5.0]
    s = fold(s, at(0), [rec("a", service_seconds=x) for x in lat], CONF)
    bk = s.models["a"].by_index()[int(at(0) // BS)]
    assert bk.count == len(lat)
    assert all(0 <= b < dm.HIST_BINS for b, _ in bk.bins()) and len(bk.hist) <= dm.HIST_BINS


def test_window_keeps_at_most_max_buckets():
    s = dm.initial(max_buckets=60)
    for b in range(200):
        s = fold(s, at(b), [rec("a")], CONF)
    keys = [bk.index for bk in s.models["a"].buckets]
    assert len(keys) == 60 and keys[-1] == int(at(199) // BS)
    # An event older than the window is counted, not folded.
    s = fold(s, at(10), [rec("a")], CONF)
    assert s.late == 1 and len(s.models["a"].buckets) == 60


def test_router_fallback_is_workload_demand_not_direct_demand():
    s = dm.initial()
    s = fold(s, at(0), [auto("coding", served="a", artifact_sha256="s1") for _ in range(5)], CONF)
    assert "a" not in s.models
    assert s.workloads["coding"].by_index()[int(at(0) // BS)].count == 5
    assert s.outcomes["a"]["coding"]["s1"].n == pytest.approx(5.0)


def test_unknown_workload_is_general_and_other_events_are_ignored():
    s = dm.initial()
    s = fold(s, at(0), [auto("astrology")], CONF)
    assert set(s.workloads) == {"general"}
    before = dm.encode_state(s)
    assert dm.apply(s, ModeSet(event_id="m", at=0.0, mode="automatic"), at(1), CONF) is s
    assert dm.encode_state(s) == before


def test_million_distinct_model_names_do_not_grow_state():
    s = dm.initial()
    s = fold(s, at(0), [rec("a"), auto("coding", served="a")], CONF)
    s.ignored = 0
    baseline = len(dm.encode_state(s))
    total = 1_000_000
    chunk = 20_000
    started = time.perf_counter()
    for start in range(0, total, chunk):
        records = tuple(
            RequestFeatures(endpoint="chat", requested_model=f"m{i}", served_model=f"m{i}", service_seconds=1.0)
            for i in range(start, start + chunk)
        )
        s = dm.apply(s, RequestBatch(event_id=str(start), at=0.0, source="gw", records=records), at(0, 5), CONF)
    elapsed = time.perf_counter() - started
    assert s.ignored == total
    assert set(s.models) == {"a"} and set(s.outcomes) == {"a"}
    s.ignored = 0
    assert len(dm.encode_state(s)) == baseline
    assert elapsed < 20.0  # a few seconds on a 2-core machine, including building the records


def test_series_for_unconfigured_or_retired_models_are_dropped():
    s = dm.initial()
    s = fold(s, at(0), [rec("a"), rec("b"), rec("b", served_model="b")], CONF)
    assert set(s.models) == {"a", "b"}
    s = fold(s, at(1), [rec("a")], frozenset({"a"}))  # "b" retired
    assert set(s.models) == {"a"} and "b" not in s.outcomes


def test_snapshot_roundtrip_is_byte_identical_and_folds_identically():
    events = [
        (at(0), [rec("a", queue_depth=3), auto("video", served="b", affinity="k1", finished_at=1.0)]),
        (at(1), [rec("b", outcome="timeout", service_seconds=9.0), auto("image", affinity="k1", finished_at=2.0)]),
        (at(2), [rec("a", evaluation=True, served_model="a", artifact_sha256="x")]),
    ]
    live = dm.initial()
    for t, rs in events[:2]:
        live = fold(live, t, rs, CONF)
    restored = dm.decode_state(encode_value(live))
    assert isinstance(restored, DemandState)
    assert dm.encode_state(restored) == dm.encode_state(live)
    t, rs = events[2]
    assert dm.encode_state(fold(restored, t, rs, CONF)) == dm.encode_state(fold(live, t, rs, CONF))
    # The runner's snapshot path: msgspec.json.decode(..., type=DemandState).
    assert msgspec.json.decode(encode_value(live), type=DemandState) == restored


def test_fold_is_a_function_of_its_inputs():
    def run():
        s = dm.initial()
        for b in range(5):
            s = fold(s, at(b), [rec("a", service_seconds=0.5 * b), auto("coding", served="b")], CONF)
        return dm.encode_state(s)

    assert run() == run()


def test_initial_validates_parameters():
    with pytest.raises(ValueError):
        dm.initial(bucket_seconds=0)
    assert dm.initial(bucket_seconds=30, max_buckets=10).max_buckets == 10
    assert T0 % BS == 0
