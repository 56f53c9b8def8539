"""Measured per-engine throughput: the fold, its bounds, and its way into placement."""

from __future__ import annotations

import math

from grid.clock import SimulatedClock
from grid.controller.tick import PROJECTIONS, compose_tick
from grid.events.codec import encode_value
from grid.events.control import ModelProfile, ModeSet, ProfileSet
from grid.events.host import HostRegistered, HostResources
from grid.events.log import InMemoryLog
from grid.events.requests import RequestBatch, RequestCompleted, RequestFeatures
from grid.fleet.planning import Policy
from grid.projections import throughput as tp
from grid.projections.position import Position
from grid.projections.runner import ProjectionRunner
from tests.heartbeats import heartbeat

SHA = "ab" * 32
OLD_SHA = "cd" * 32
MODEL = "model-a.Q4.gguf"
CONFIGURED = frozenset({MODEL})


def rec(host: str = "host-a", *, tokens: int = 100, seconds: float = 1.0, sha: str | None = SHA, **kw) -> RequestFeatures:
    base = dict(endpoint="chat", requested_model=MODEL, served_model=MODEL, host_id=host, output_units=tokens,
                service_seconds=seconds, artifact_sha256=sha)
    base.update(kw)
    return RequestFeatures(**base)


def batch(*records: RequestFeatures, eid: str = "b") -> RequestBatch:
    return RequestBatch(event_id=eid, at=0.0, source="gw", records=tuple(records))


def fold(events, t0: float = 1000.0, state=None) -> tp.ThroughputState:
    state = state or tp.initial()
    for i, e in enumerate(events):
        state = tp.apply(state, e, Position("GRID_REQS", i + 1, t0 + i), CONFIGURED)
    return state


def profile(sha: str | None = SHA) -> ModelProfile:
    return ModelProfile(model_id=MODEL, memory_mb=1000, artifact_sha256=sha)


def test_authoritative_only_after_four_samples_then_an_eight_sample_ewma() -> None:
    three = fold([batch(rec(tokens=100), rec(tokens=100), rec(tokens=100))])
    assert tp.measured(three, [profile()], 2000.0) == {}
    four = fold([batch(rec(tokens=100), rec(tokens=100), rec(tokens=100)), RequestCompleted(
        event_id="c", at=0.0, features=rec(tokens=1000))])
    got = four.entries[tp.key("host-a", MODEL, SHA)]
    assert got.samples == 4
    assert math.isclose(got.ewma_tps, 100 + (2 / 9) * 900)
    assert tp.measured(four, [profile()], 2000.0) == {"host-a": {MODEL: got.ewma_tps}}


def test_invalid_samples_are_ignored_and_never_create_state() -> None:
    bad = [
        rec(seconds=0.0), rec(seconds=-1.0), rec(seconds=float("nan")), rec(seconds=float("inf")),
        rec(seconds=3600.5), rec(tokens=0), rec(tokens=-5), rec(outcome="error"), rec(outcome="timeout"),
        rec(endpoint="embeddings"), rec(modality="image"), rec(host_id=None), rec(served_model=None),
        rec(tokens=10**9, seconds=0.0001),  # above any real engine's rate
    ]
    state = fold([batch(*bad)])
    assert state.entries == {} and state.ignored == len(bad) - 1  # served_model=None is not a sample at all
    # A model that is not configured creates nothing either (bounded by the catalog).
    other = fold([batch(rec(served_model="nobody", requested_model="nobody"))])
    assert other.entries == {} and other.ignored == 0


def test_keyed_by_revision_and_the_configured_revision_decides() -> None:
    state = fold([batch(*[rec(sha=OLD_SHA, tokens=500)] * 4), batch(*[rec(sha=SHA.upper(), tokens=50)] * 4)])
    assert tp.measured(state, [profile(SHA)], 2000.0) == {"host-a": {MODEL: 50.0}}
    assert tp.measured(state, [profile(OLD_SHA)], 2000.0) == {"host-a": {MODEL: 500.0}}
    # A profile with a revision nobody measured falls back to no measurement (hardware priors).
    assert tp.measured(state, [profile("ef" * 32)], 2000.0) == {}
    # Without a configured revision, the most recently updated evidence counts.
    assert tp.measured(state, [profile(None)], 2000.0) == {"host-a": {MODEL: 50.0}}
    # Models without a profile are not reported.
    assert tp.measured(state, [], 2000.0) == {}


def test_expires_after_thirty_days_and_relearns_from_scratch() -> None:
    state = fold([batch(*[rec(tokens=100)] * 4)], t0=1000.0)
    assert tp.measured(state, [profile()], 1000.0 + tp.MAX_AGE_SECONDS) != {}
    assert tp.measured(state, [profile()], 1000.0 + tp.MAX_AGE_SECONDS + 1) == {}
    later = fold([batch(rec(tokens=900))], t0=1000.0 + tp.MAX_AGE_SECONDS + 1, state=state)
    fresh = later.entries[tp.key("host-a", MODEL, SHA)]
    assert fresh.samples == 1 and fresh.ewma_tps == 900.0


def test_bounded_entries_drop_the_least_recently_updated() -> None:
    state = tp.initial()
    n = tp.MAX_ENTRIES + 10
    for i in range(n):
        tp.apply(state, batch(rec(host=f"h{i:05d}")), Position("GRID_REQS", i + 1, float(i)), CONFIGURED)
    assert len(state.entries) == tp.MAX_ENTRIES
    assert tp.key("h00000", MODEL, SHA) not in state.entries
    assert tp.key(f"h{n - 1:05d}", MODEL, SHA) in state.entries


def test_same_events_give_the_same_bytes() -> None:
    events = [batch(rec(host=h, tokens=t, seconds=s)) for h, t, s in
              [("host-b", 300, 1.5), ("host-a", 120, 0.7), ("host-b", 310, 1.2), ("host-a", 90, 0.9)] * 3]
    assert encode_value(fold(events)) == encode_value(fold(list(events)))


async def _fleet_with_measurements(fast: str, slow: str, *, measured: bool = True) -> tuple[dict, float]:
    """Two identical empty hosts, one model to place, and (optionally) measured rates on each."""
    clock = SimulatedClock(1_800_000_000.0)
    log = InMemoryLog(clock)
    res = HostResources(capacity_mb=8000)
    await log.append(ModeSet(event_id="mode", at=clock.now(), mode="automatic"))
    await log.append(ProfileSet(event_id="p", at=clock.now(), profile=ModelProfile(
        model_id=MODEL, memory_mb=2000, artifact_sha256=SHA, min_replicas=1, max_replicas=1)))
    for h in sorted((fast, slow)):
        await log.append(HostRegistered(event_id=f"reg-{h}", at=clock.now(), host_id=h, resources=res))
    if measured:
        await log.append(batch(*[rec(host=slow, tokens=20)] * 4, *[rec(host=fast, tokens=80)] * 4, eid="rb"))
    clock.advance(5.0)
    for h in sorted((fast, slow)):
        await log.append(heartbeat(h, event_id=f"hb-{h}", at=clock.now(), resources=res,
                                   disk_free_bytes=100 << 30, disk_total_bytes=200 << 30))
    runner = ProjectionRunner(PROJECTIONS)
    await runner.catch_up(log)
    return runner.states, clock.now()


async def test_the_planner_places_a_new_replica_on_the_measured_faster_host() -> None:
    for fast, slow in (("host-b", "host-a"), ("host-a", "host-b")):
        states, now = await _fleet_with_measurements(fast, slow)
        tick = compose_tick(states, now, Policy())
        by_host = {h.host_id: h.measured_tokens_per_second for h in tick.planner_input.hosts}
        assert by_host == {fast: {MODEL: 80.0}, slow: {MODEL: 20.0}}
        assert [(p.host_id, p.model_id) for p in tick.plan.placements] == [(fast, MODEL)]
        # Deterministic: the same states give the same input and plan bytes.
        again = compose_tick(states, now, Policy())
        assert encode_value(again.planner_input) == encode_value(tick.planner_input)
        assert encode_value(again.plan) == encode_value(tick.plan)


def test_evaluation_traffic_teaches_throughput_but_creates_no_demand_or_evidence() -> None:
    from grid.demand import fold as demand_fold

    marked = [rec(tokens=80, evaluation=True, workload="coding") for _ in range(4)]
    state = fold([batch(*marked)])
    assert tp.measured(state, [profile()], 2000.0) == {"host-a": {MODEL: 80.0}}
    demand = demand_fold.apply(demand_fold.initial(), batch(*marked), 1000.0, CONFIGURED)
    assert demand.models == {} and demand.workloads == {} and demand.outcomes == {}
    ordinary = demand_fold.apply(demand_fold.initial(), batch(rec(workload="coding")), 1000.0, CONFIGURED)
    assert MODEL in ordinary.models and MODEL in ordinary.outcomes
