import pytest

from grid.demand import correlation as cor
from grid.demand.forecast import forecast
from grid.demand import fold as dm

from tests.unit.demand.fc_helpers import BS, at, feed, fold, profile, rec, row, target

MODELS = [f"m{i}" for i in range(40)] + ["a", "b", "c", "t"]
CONF = frozenset(MODELS)


def series(state, model, buckets, n=10, **kw):
    for b in buckets:
        state = fold(state, at(b), [rec(model, **kw) for _ in range(n)], CONF)
    return state


def profiles(*ids):
    # No cooldown: a target's own old demand is stale, so only correlation can desire it.
    return [profile(m, max_replicas=4, scale_down_cooldown_seconds=0.0) for m in ids]


def test_mature_group_prewarms_a_quiet_peer_as_inferred():
    s = dm.initial()
    s = series(s, "a", [0, 1, 2, 3, 4, 10])
    s = series(s, "b", [0, 1, 2, 3, 4])
    fc = forecast(s, profiles("a", "b"), at(10, 30.0))
    t = target(fc, "b")
    assert t is not None and t.evidence == "inferred" and t.reason == "correlation:group:a"
    # Old target-local queue/latency/error evidence is not refreshed by an association.
    assert (t.harm.queue, t.harm.latency_ratio, t.harm.errors, t.harm.rate) == (0.0, 0.0, 0.0, 0.0)
    r = row(fc, "b")
    assert r.direct_offered == 0.0 and r.inferred_rate > 0.0 and r.offered_concurrency == r.inferred_offered
    e = next(e for e in fc.correlations if e.target == "b" and e.kind == "group")
    assert (e.source, e.support, e.association) == ("a", 5, 1.0)


def test_threshold_and_minimum_support():
    s = dm.initial()
    s = series(s, "a", [0, 1, 2, 3, 4, 5, 10])
    s = series(s, "b", [0, 1, 2])  # 3 of a's 6 complete buckets: 0.5 < 0.70
    assert target(forecast(s, profiles("a", "b"), at(10, 30.0)), "b") is None
    s2 = dm.initial()
    s2 = series(s2, "a", [0, 1, 10])
    s2 = series(s2, "b", [0, 1])  # association 1.0 but only two supporting buckets
    assert target(forecast(s2, profiles("a", "b"), at(10, 30.0)), "b") is None


def test_directional_next_bucket_pair():
    s = dm.initial()
    for b in (0, 5, 10, 15):
        s = series(s, "a", [b])
        s = series(s, "b", [b + 1])
    s = series(s, "a", [20])
    fc = forecast(s, profiles("a", "b"), at(21, 5.0))  # a was active in the last complete bucket
    t = target(fc, "b")
    assert t is not None and t.reason == "correlation:next:a"
    e = next(e for e in fc.correlations if e.kind == "next")
    assert (e.source, e.target, e.support) == ("a", "b", 4)
    # The reverse direction is not learned.
    assert not any(e.source == "b" for e in fc.correlations)


def test_incomplete_future_bucket_is_not_a_transition_failure():
    s = dm.initial()
    # a -> b three times, one failure, and a in the last complete bucket (its t+1 is incomplete).
    for b in (0, 4, 8):
        s = series(s, "a", [b])
        s = series(s, "b", [b + 1])
    s = series(s, "a", [12, 16])
    now = at(17, 10.0)
    act = cor.activity(s, now, ["a", "b"])
    assert act.hi == int(at(16) // BS)
    edges = cor.edges_from(s, act, "a", ["b"])
    nxt = [e for e in edges if e.kind == "next"]
    # 3 / 4 = 0.75 passes; counting bucket 16 as a failure would give 3 / 5 = 0.6.
    assert len(nxt) == 1 and nxt[0].association == pytest.approx(0.75)


def test_inferred_demand_is_capped_at_twice_the_targets_peak():
    s = dm.initial()
    s = series(s, "a", [0, 1, 2, 3, 4], n=10)
    s = series(s, "b", [0, 1, 2, 3, 4], n=10)
    s = series(s, "a", [9], n=3000)  # the source explodes now
    fc = forecast(s, [profile(m, max_replicas=1000, scale_down_cooldown_seconds=0.0) for m in "ab"], at(10, 0.0))
    r = row(fc, "b")
    assert r.inferred_rate == pytest.approx(2.0 * 10 / BS)


def test_max_not_sum_across_sources_and_never_transitive():
    s = dm.initial()
    # a and c each predict t; b is predicted by a; t2-style chain a -> b -> c is not followed.
    s = series(s, "a", [0, 1, 2, 3, 20])
    s = series(s, "c", [0, 1, 2, 3, 20])
    s = series(s, "t", [0, 1, 2, 3])
    fc = forecast(s, profiles("a", "c", "t"), at(21, 0.0))
    r = row(fc, "t")
    inferred = {e.source: e for e in fc.correlations if e.target == "t" and e.kind == "group"}
    assert set(inferred) == {"a", "c"}
    single = max(row(fc, m).observed_rate * e.ratio * e.confidence for m, e in inferred.items())
    assert r.inferred_rate == pytest.approx(min(single, 2 * 10 / BS))


def test_correlation_never_propagates_transitively():
    s = dm.initial()
    s = series(s, "b", list(range(10)))  # b: buckets 0..9
    s = series(s, "c", list(range(3, 10)))  # c with b 7/10 = 0.70
    s = series(s, "a", [0, 1, 2, 3, 30])  # a -> b (4/4); a -> c only 1/4
    fc = forecast(s, profiles("a", "b", "c"), at(31, 0.0))
    assert target(fc, "b") is not None and target(fc, "b").evidence == "inferred"
    assert target(fc, "c") is None  # b is only inferred, so it is never a source


def test_at_most_32_sources():
    s = dm.initial()
    for i in range(40):
        s = series(s, f"m{i}", [0, 1, 2, 3, 10], n=1 + i)
    s = series(s, "t", [0, 1, 2, 3])
    fc = forecast(s, profiles(*[f"m{i}" for i in range(40)], "t"), at(10, 30.0))
    sources = {e.source for e in fc.correlations}
    assert len(sources) == cor.MAX_SOURCES
    assert "m39" in sources and "m0" not in sources  # highest current rates first
    assert target(fc, "t").evidence == "inferred"


def test_active_target_is_not_inferred():
    s = dm.initial()
    s = series(s, "a", [0, 1, 2, 3, 10])
    s = series(s, "b", [0, 1, 2, 3, 10])
    fc = forecast(s, profiles("a", "b"), at(10, 30.0))
    assert target(fc, "b").evidence == "direct" and row(fc, "b").inferred_rate == 0.0
    assert feed is not None
