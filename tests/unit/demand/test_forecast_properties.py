"""Hypothesis properties of the demand fold and the forecast."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grid.events.codec import encode_value
from grid.events.requests import WORKLOADS, RequestFeatures
from grid.demand import affinity as af
from grid.demand.forecast import forecast
from grid.demand import fold as dm

from tests.unit.demand.fc_helpers import BS, T0, batch, profile

CONFIGURED = ("a", "b", "c", "d")
NAMES = CONFIGURED + ("auto", "junk-1", "junk-2", "")
OUTCOMES = ("ok", "error", "rejected", "unavailable", "timeout", "cancelled")

finite = st.floats(min_value=0.0, max_value=600.0, allow_nan=False)
weird = st.one_of(finite, st.sampled_from([float("nan"), float("inf"), -1.0, 1e12]))

record = st.builds(
    RequestFeatures,
    endpoint=st.sampled_from(["chat", "completions", "embeddings", "image", "video"]),
    requested_model=st.sampled_from(NAMES),
    served_model=st.one_of(st.none(), st.sampled_from(NAMES)),
    workload=st.sampled_from(WORKLOADS + ("unknown",)),
    service_seconds=weird,
    queue_seconds=weird,
    queue_depth=st.integers(min_value=-5, max_value=10_000_000),
    outcome=st.sampled_from(OUTCOMES),
    status_code=st.sampled_from([200, 400, 429, 500, 503]),
    auto=st.booleans(),
    affinity=st.one_of(st.none(), st.sampled_from(["k1", "k2", "k3"])),
    finished_at=st.floats(min_value=0.0, max_value=1e4, allow_nan=False),
    artifact_sha256=st.one_of(st.none(), st.sampled_from(["s1", "s2"])),
    evaluation=st.booleans(),
)
# (seconds since the previous event, records)
steps = st.lists(
    st.tuples(st.floats(min_value=0.0, max_value=900.0, allow_nan=False), st.lists(record, min_size=1, max_size=8)),
    min_size=1, max_size=25,
)
prof = st.builds(
    lambda m, lo, extra, util, conc, cd, slo, scores: profile(
        m, min_replicas=lo, max_replicas=lo + extra, target_utilization=util, replica_concurrency=conc,
        scale_down_cooldown_seconds=cd, latency_slo_ms=slo, workload_scores=scores,
    ),
    st.sampled_from(CONFIGURED),
    st.integers(0, 3), st.integers(0, 5),
    st.floats(min_value=0.0, max_value=1.5, allow_nan=False),
    st.integers(0, 8),
    st.sampled_from([0.0, 60.0, 600.0]),
    st.one_of(st.none(), st.floats(min_value=1.0, max_value=5000.0)),
    st.dictionaries(st.sampled_from(WORKLOADS), st.floats(min_value=0.0, max_value=1.0), max_size=3),
)
ready = st.dictionaries(st.sampled_from(NAMES), st.integers(0, 6), max_size=4)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run(events, max_buckets=8):
    s = dm.initial(max_buckets=max_buckets)
    t = T0
    configured = frozenset(CONFIGURED)
    for dt, records in events:
        t += dt
        s = dm.apply(s, batch(records), t, configured)
    return s, t


@SETTINGS
@given(steps)
def test_state_stays_bounded(events):
    s, _ = run(events)
    assert set(s.models) <= set(CONFIGURED)
    assert set(s.outcomes) <= set(CONFIGURED)
    assert set(s.workloads) <= set(WORKLOADS)
    for series in list(s.models.values()) + list(s.workloads.values()):
        idx = [bk.index for bk in series.buckets]
        assert idx == sorted(set(idx)) and len(idx) <= s.max_buckets
        for bk in series.buckets:
            assert len(bk.hist) <= dm.HIST_BINS and all(n >= 0 for n in bk.hist)
    assert len(s.affinity.cursors) <= af.MAX_WORKFLOWS
    assert len(s.affinity.transitions) <= af.MAX_TRANSITIONS


@SETTINGS
@given(steps, st.integers(min_value=0, max_value=24))
def test_fold_is_deterministic_and_snapshot_transparent(events, cut):
    whole, _ = run(events)
    assert dm.encode_state(whole) == dm.encode_state(run(events)[0])
    # Snapshot after `cut` events, restore, fold the rest: same bytes.
    cut = min(cut, len(events))
    head, t = run(events[:cut])
    restored = dm.decode_state(encode_value(head))
    configured = frozenset(CONFIGURED)
    for dt, records in events[cut:]:
        t += dt
        restored = dm.apply(restored, batch(records), t, configured)
    assert dm.encode_state(restored) == dm.encode_state(whole)


@SETTINGS
@given(steps, st.lists(prof, min_size=1, max_size=4), ready, st.floats(min_value=0.0, max_value=4000.0))
def test_forecast_targets_are_bounded_sorted_and_deterministic(events, profiles, ready_map, later):
    s, t = run(events)
    now = t + later
    fc = forecast(s, profiles, now, ready_replicas=ready_map, watermarks={"a": t - 30.0})
    by_id = {}
    for p in profiles:
        by_id[p.model_id] = p  # the last profile given for an id wins
    ids = [x.model_id for x in fc.targets]
    assert ids == sorted(set(ids))
    for target in fc.targets:
        p = by_id[target.model_id]
        assert target.replicas >= 1
        assert p.min_replicas <= target.replicas <= max(p.max_replicas, p.min_replicas)
        assert target.evidence in ("baseline", "direct", "inferred")
        if target.canary:
            assert target.replicas == 1 and target.evidence == "inferred"
        assert target.offered_concurrency >= 0.0
        h = target.harm
        assert min(h.queue, h.latency_ratio, h.errors, h.concurrency, h.rate) >= 0.0
    for p in by_id.values():
        if p.min_replicas > 0:
            assert p.model_id in ids
    again = forecast(dm.decode_state(dm.encode_state(s)), list(reversed(profiles)) if len(set(
        p.model_id for p in profiles)) == len(profiles) else profiles, now,
        ready_replicas=dict(sorted(ready_map.items())), watermarks={"a": t - 30.0})
    assert encode_value(again) == encode_value(fc)


@SETTINGS
@given(st.lists(st.integers(0, 200), min_size=3, max_size=12), st.floats(min_value=0.0, max_value=3600.0))
def test_rising_demand_never_beyond_twice_the_level_and_falling_never_below_it(counts, start):
    s = dm.initial()
    conf = frozenset({"a"})
    for i, n in enumerate(counts):
        if n:
            recs = [RequestFeatures(endpoint="chat", requested_model="a", service_seconds=1.0)] * n
            s = dm.apply(s, batch(recs), T0 + i * BS + 1.0, conf)
    fc = forecast(s, [profile("a", max_replicas=10_000)], T0 + len(counts) * BS, fastest_start_seconds={"a": start})
    r = fc.models[0]
    assert r.observed_rate <= r.rate <= 2.0 * r.observed_rate + 1e-9
    assert r.target >= 0
