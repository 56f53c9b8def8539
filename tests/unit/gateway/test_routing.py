"""Pure routing: eligibility gates, admission, protection class, expected completion, affinity."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from grid.events.control import ModelProfile
from grid.events.host import HostResources
from grid.fleet.views import HostView, ResidencyView
from grid.gateway import routing
from grid.gateway.measure import Measurements
from grid.gateway.routing import RouteCandidate, choose

NOW = 1_800_000_000.0


def cand(host: str, *, model: str = "m", state: str = "ready", host_state: str = "accepting",
         hb_age: float | None = 1.0, active: int = 0, conc: int | None = 4, sha: str | None = None,
         endpoint: str | None = "default", queue: int = 0, throttle: float = 0.5) -> RouteCandidate:
    ep = f"http://{host}:8080" if endpoint == "default" else endpoint
    return RouteCandidate(
        key=(host, ep or "", model), host_id=host, model_id=model, endpoint=ep, state=state,
        host_state=host_state, heartbeat_at=None if hb_age is None else NOW - hb_age,
        active_requests=active, max_concurrency=conc, throttle_fraction=throttle, queue_depth=queue,
        artifact_sha256=sha,
    )


def record_responses(ms: Measurements, c: RouteCandidate, latency: float, n: int = 8, tokens: int | None = None,
                     at: float = NOW, sha: str | None = None) -> None:
    for _ in range(n):
        ms.record_response(c.key, sha if sha is not None else c.artifact_sha256, latency, tokens, at)


def test_build_table_groups_by_model_and_keeps_every_residency() -> None:
    snap = HostView(
        host_id="h1", state="accepting", resources=HostResources(capacity_mb=1000), heartbeat_at=NOW,
        residencies=(
            ResidencyView(model_id="a", memory_mb=1, state="ready", endpoint="http://h1:1"),
            ResidencyView(model_id="b", memory_mb=1, state="loading"),
        ),
    )
    table = routing.build_table([snap])
    assert sorted(table) == ["a", "b"]
    assert table["a"][0].key == ("h1", "http://h1:1", "a")
    assert routing.ready_models(table, NOW) == ["a"]


def test_only_ready_residencies_on_accepting_or_throttled_fresh_hosts_are_eligible() -> None:
    good = cand("good")
    reasons = {
        routing.EXCLUDED_DRAINING: cand("a", state="draining"),
        routing.EXCLUDED_NOT_READY: cand("b", state="warming"),
        routing.EXCLUDED_HOST_FENCED: cand("c", host_state="paused"),
        routing.EXCLUDED_NO_ENDPOINT: cand("d", endpoint=None),
        routing.EXCLUDED_NO_HEARTBEAT: cand("e", hb_age=None),
        routing.EXCLUDED_STALE: cand("f", hb_age=31.0),
        routing.EXCLUDED_FUTURE: cand("g", hb_age=-6.0),
    }
    for reason, c in reasons.items():
        assert routing.exclusion(c, NOW) == reason
    for state in ("paused", "unhealthy", "quarantined"):
        assert routing.exclusion(cand("x", host_state=state), NOW) == routing.EXCLUDED_HOST_FENCED
    assert routing.exclusion(good, NOW) is None
    assert routing.exclusion(cand("t", host_state="throttled"), NOW) is None
    # An evacuating (draining) host keeps serving what it holds until the reconciler drains it.
    assert routing.exclusion(cand("v", host_state="draining"), NOW) is None
    # inside the future-skew window is fine (clamped to zero age)
    assert routing.exclusion(cand("s", hb_age=-4.0), NOW) is None
    d = choose([*reasons.values(), good], now=NOW)
    assert d.route is good


def test_draining_only_means_no_ready_replica() -> None:
    d = choose([cand("a", state="draining"), cand("b", host_state="paused")], now=NOW)
    assert d.route is None and d.reason == routing.REASON_NO_READY


def test_an_evacuating_host_only_takes_what_no_admitting_host_can() -> None:
    leaving = cand("a", host_state="draining", active=0, conc=4)
    staying = cand("b", host_state="throttled", active=1, conc=4)
    assert choose([leaving, staying], now=NOW).route is staying
    assert choose([leaving], now=NOW).route is leaving
    assert choose([leaving, cand("b", active=4, conc=4)], now=NOW).route is leaving


def test_accepting_beats_a_less_loaded_throttled_host() -> None:
    busy = cand("busy", active=3, conc=4)
    idle_throttled = cand("idle", host_state="throttled", active=0, conc=8)
    assert choose([idle_throttled, busy], now=NOW).route is busy
    # ... but a full accepting host hands over to the throttled one (admission first)
    full = cand("full", active=4, conc=4)
    assert choose([idle_throttled, full], now=NOW).route is idle_throttled


def test_load_is_a_fraction_of_effective_concurrency_not_a_raw_count() -> None:
    narrow = cand("narrow", active=3, conc=4)  # 75 %
    wide = cand("wide", active=5, conc=16)  # 31 %, but more raw requests
    assert choose([narrow, wide], now=NOW).route is wide


def test_missing_capacity_is_raw_load_and_zero_capacity_is_closed() -> None:
    unknown = cand("unknown", active=1, conc=None)
    known = cand("known", active=1, conc=4)
    assert choose([unknown, known], now=NOW).route is known
    closed = cand("closed", conc=0)
    d = choose([closed], now=NOW)
    assert d.route is None and d.reason == routing.REASON_CLOSED
    assert choose([closed, unknown], now=NOW).route is unknown


def test_admission_is_a_hard_limit_and_proxy_counters_count() -> None:
    a = cand("a", active=0, conc=2)
    d = choose([a], now=NOW, proxy_active={a.key: 2})
    assert d.route is None and d.reason == routing.REASON_AT_CAPACITY
    # once the proxy owns a route's counter, a stale heartbeat count does not block it ...
    b = cand("b", active=2, conc=2)
    assert choose([b], now=NOW, proxy_active={b.key: 0}).route is b
    # ... while a route the proxy never used is judged by its heartbeat
    assert choose([b], now=NOW, proxy_active={}).reason == routing.REASON_AT_CAPACITY


def test_throttled_host_advertises_only_its_fraction() -> None:
    t = cand("t", host_state="throttled", conc=4, throttle=0.5, active=2)
    assert routing.effective_concurrency(t) == 2
    assert choose([t], now=NOW).reason == routing.REASON_AT_CAPACITY
    assert routing.effective_concurrency(cand("t1", host_state="throttled", conc=1, throttle=0.1)) == 1


def test_open_circuit_is_skipped_and_reported() -> None:
    a, b = cand("a"), cand("b")
    assert choose([a, b], now=NOW, blocked={a.key}).route is b
    d = choose([a, b], now=NOW, blocked={a.key, b.key})
    assert d.route is None and d.reason == routing.REASON_CIRCUIT_OPEN
    assert set(d.circuit_blocked) == {a.key, b.key}


def test_measured_faster_engine_wins_and_other_models_do_not_lend_evidence() -> None:
    slow, fast = cand("slow"), cand("fast")
    ms = Measurements()
    record_responses(ms, slow, 2.0)
    record_responses(ms, fast, 0.5)
    assert choose([slow, fast], now=NOW, measurements=ms.view()).route is fast
    # evidence recorded for another model on the "fast" engine is ignored
    other_model = dataclasses.replace(fast, key=("fast", fast.endpoint or "", "other"), model_id="other")
    ms2 = Measurements()
    record_responses(ms2, other_model, 0.01)
    d = choose([fast], now=NOW, measurements=ms2.view(), prior_latency_seconds=1.0)
    assert d.route is fast and d.expected_seconds == 1.0  # the prior, not the other model's 0.01


def test_artifact_revision_binds_measurements() -> None:
    old = cand("a", sha="old")
    new = cand("a", sha="new")
    b = cand("b", sha="new")
    ms = Measurements()
    record_responses(ms, old, 0.1)  # excellent, but for the previous revision
    d = choose([new], now=NOW, measurements=ms.view(), prior_latency_seconds=3.0)
    assert d.expected_seconds == 3.0  # the old revision's evidence is ignored
    record_responses(ms, b, 1.0)
    assert choose([new, b], now=NOW, measurements=ms.view(), prior_latency_seconds=3.0).expected_seconds == 1.0
    # the first response of the new revision resets the estimator instead of blending
    ms.record_response(new.key, "new", 5.0, None, NOW)
    m = ms.get(new.key)
    assert m is not None and m.latency.samples == 1 and m.latency.value == 5.0


def test_expired_evidence_falls_back_and_weak_evidence_blends() -> None:
    a, b = cand("a"), cand("b")
    ms = Measurements()
    record_responses(ms, a, 10.0, at=NOW - 7200)  # expired
    record_responses(ms, b, 1.0, at=NOW - 7200)
    d = choose([a, b], now=NOW, measurements=ms.view(), prior_latency_seconds=1.0)
    # both expired: equal priors, the tie goes by engine name
    assert d.route is a
    # one weak sample blends toward the prior instead of dominating
    ms2 = Measurements()
    record_responses(ms2, a, 0.01, n=1)
    d2 = choose([a], now=NOW, measurements=ms2.view(), prior_latency_seconds=1.0)
    assert 0.8 < d2.expected_seconds < 1.0


def test_confidence_ramps_over_eight_samples() -> None:
    ms = Measurements()
    a = cand("a")
    weights = []
    for _ in range(10):
        ms.record_response(a.key, None, 1.0, None, NOW)
        weights.append(ms.get(a.key).latency.weight(NOW))  # type: ignore[union-attr]
    assert weights[0] == 1 / 8 and weights[3] == 0.5 and weights[7] == 1.0 and weights[9] == 1.0


def test_max_tokens_bound_prefers_throughput_for_long_generations() -> None:
    snappy = cand("snappy")  # low latency, slow tokens
    thick = cand("thick")  # higher latency, fast tokens
    ms = Measurements()
    record_responses(ms, snappy, 0.2, tokens=4)  # 20 tok/s
    record_responses(ms, thick, 0.5, tokens=100)  # 200 tok/s
    assert choose([snappy, thick], now=NOW, measurements=ms.view(), max_tokens=2).route is snappy
    assert choose([snappy, thick], now=NOW, measurements=ms.view(), max_tokens=1000).route is thick


def test_queued_work_counts_in_the_service_wave() -> None:
    backlog = cand("backlog", conc=4, queue=8)
    clear = cand("clear", conc=4)
    assert choose([backlog, clear], now=NOW).route is clear


def test_freshest_lease_breaks_ties_but_future_skew_gets_no_bonus() -> None:
    older = cand("a", hb_age=10.0)
    fresher = cand("b", hb_age=2.0)
    assert choose([older, fresher], now=NOW).route is fresher
    future = cand("a", hb_age=-3.0)  # clamped to zero age
    now_ = cand("b", hb_age=0.0)
    assert choose([future, now_], now=NOW).route is future  # equal age: the name decides


def test_affinity_stays_within_twenty_percent_of_the_best() -> None:
    fast, ok, slow = cand("fast"), cand("ok"), cand("slow")
    ms = Measurements()
    record_responses(ms, fast, 1.0)
    record_responses(ms, ok, 1.15)
    record_responses(ms, slow, 1.5)
    chosen = {choose([fast, ok, slow], now=NOW, measurements=ms.view(), affinity=bytes([i]) * 32).route.host_id
              for i in range(64)}  # type: ignore[union-attr]
    assert chosen == {"fast", "ok"}


def test_affinity_respects_protection_class() -> None:
    acc = cand("acc")
    thr = [cand(f"t{i}", host_state="throttled") for i in range(4)]
    for i in range(32):
        assert choose([acc, *thr], now=NOW, affinity=bytes([i]) * 32).route is acc


def test_choice_is_deterministic_and_order_independent() -> None:
    cs = [cand(f"h{i}", active=i % 3, conc=4) for i in range(6)]
    first = choose(cs, now=NOW, affinity=b"k" * 32).route
    assert choose(list(reversed(cs)), now=NOW, affinity=b"k" * 32).route is first


@settings(max_examples=150, deadline=None)
@given(st.lists(
    st.tuples(
        st.sampled_from(["ready", "draining", "warming"]),
        st.sampled_from(["accepting", "throttled", "draining", "paused"]),
        st.integers(0, 6), st.one_of(st.none(), st.integers(0, 6)), st.floats(-10, 60), st.booleans(),
    ),
    min_size=0, max_size=8,
), st.one_of(st.none(), st.binary(min_size=32, max_size=32)), st.one_of(st.none(), st.integers(1, 4000)))
def test_property_chosen_route_passes_every_hard_gate(specs, affinity, max_tokens) -> None:  # type: ignore[no-untyped-def]
    cs = [cand(f"h{i}", state=s, host_state=hs, active=a, conc=c, hb_age=age)
          for i, (s, hs, a, c, age, _b) in enumerate(specs)]
    blocked = {c.key for c, spec in zip(cs, specs) if spec[5]}
    d = choose(cs, now=NOW, blocked=blocked, affinity=affinity, max_tokens=max_tokens)
    admissible = [
        c for c in cs
        if routing.exclusion(c, NOW) is None and c.key not in blocked
        and routing.effective_concurrency(c) != 0
        and (routing.effective_concurrency(c) is None or c.active_requests < routing.effective_concurrency(c))
    ]
    if not admissible:
        assert d.route is None
        return
    r = d.route
    assert r is not None and r in admissible
    assert r.state == "ready" and r.host_state in ("accepting", "throttled", "draining")
    best_rank = min(routing.PROTECTION_RANK[c.host_state] for c in admissible)
    assert routing.PROTECTION_RANK[r.host_state] == best_rank


def _profile(model: str, **scores: float) -> ModelProfile:
    return ModelProfile(model_id=model, memory_mb=100, workload_scores=scores, load_seconds=20, warm_seconds=5)


def test_auto_model_picks_the_best_ready_scorer() -> None:
    profiles = {
        "coder": _profile("coder", coding=0.9),
        "generalist": _profile("generalist", general=0.6, coding=0.3),
        "embedder": _profile("embedder", embedding=1.0),
    }
    assert routing.auto_model("coding", profiles, {"coder", "generalist", "embedder"}) == "coder"
    assert routing.auto_model("coding", profiles, {"generalist", "embedder"}) == "generalist"
    assert routing.auto_model("research", profiles, {"generalist", "embedder"}) == "generalist"
    assert routing.auto_model("research", profiles, {"embedder"}) is None
    assert routing.auto_model("embedding", profiles, {"generalist", "embedder"}) == "embedder"
    assert routing.auto_model("embedding", profiles, {"generalist"}) is None
    assert routing.auto_model("coding", {}, {"unprofiled"}) is None


def test_auto_retry_after_is_the_quickest_configured_cold_start() -> None:
    profiles = {"a": _profile("a", coding=1.0), "b": ModelProfile(model_id="b", memory_mb=1,
                                                                     workload_scores={"coding": 0.5},
                                                                     load_seconds=2, warm_seconds=1)}
    assert routing.auto_retry_after("coding", profiles) == 3.0
    assert routing.auto_retry_after("video", profiles) == routing.DEFAULT_AUTO_RETRY_SECONDS
