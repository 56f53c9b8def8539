"""Automatic (`auto`) demand in the forecast: fleet-feasible candidates, and hysteresis through dips."""

from __future__ import annotations

from grid.demand import fold
from grid.demand.forecast import forecast
from grid.events.control import ModelProfile
from grid.events.requests import RequestBatch, RequestFeatures

NOW = 1_800_000_000.0


def _demand() -> fold.DemandState:
    state = fold.initial()
    configured = frozenset({"huge", "small"})
    for minute in range(10):
        t = NOW - 600 + minute * 60 + 30
        records = tuple(RequestFeatures(endpoint="chat", requested_model="auto", auto=True, workload="general",
                                        service_seconds=3.0, finished_at=t) for _ in range(20))
        state = fold.apply(state, RequestBatch(event_id=f"b{minute}", at=t, source="t", records=records), t, configured)
    return state


PROFILES = [
    ModelProfile(model_id="huge", memory_mb=900_000, workload_scores={"general": 0.95}, max_replicas=3),
    ModelProfile(model_id="small", memory_mb=6_000, workload_scores={"general": 0.8}, max_replicas=3),
]


def test_workload_demand_skips_a_model_that_fits_nowhere() -> None:
    unscanned = forecast(_demand(), PROFILES, NOW)
    [row] = [w for w in unscanned.workloads if w.workload == "general"]
    assert row.model_id == "huge"  # the old behaviour, still what an unscanned caller gets
    scanned = forecast(_demand(), PROFILES, NOW, placeable=frozenset({"small"}))
    [row] = [w for w in scanned.workloads if w.workload == "general"]
    assert row.model_id == "small"
    assert {t.model_id for t in scanned.targets} == {"small"}
    nothing = forecast(_demand(), PROFILES, NOW, placeable=frozenset())
    [row] = [w for w in nothing.workloads if w.workload == "general"]
    assert row.model_id is None and not nothing.targets


def test_auto_replicas_are_held_through_a_dip_within_the_cooldown() -> None:
    # Busy minutes earlier (two replicas' worth of `auto` general work), a quiet last minute:
    # the ready replicas stay desired within the cooldown, as named demand's do.
    state = fold.initial()
    configured = frozenset({"small"})
    for minute, n in enumerate([60, 60, 60, 60, 2, 2, 2, 2, 2, 2]):
        t = NOW - 600 + minute * 60 + 30
        records = tuple(RequestFeatures(endpoint="chat", requested_model="auto", auto=True, workload="general",
                                        service_seconds=3.0, finished_at=t) for _ in range(n))
        state = fold.apply(state, RequestBatch(event_id=f"b{minute}", at=t, source="t", records=records), t, configured)
    small = [ModelProfile(model_id="small", memory_mb=6_000, workload_scores={"general": 0.8}, max_replicas=3,
                          replica_concurrency=1)]
    held = forecast(state, small, NOW, ready_replicas={"small": 3})
    [target] = held.targets
    assert target.replicas == 3 and "cooldown_hold" in target.reason
    # nothing ready: the hold never asks for more than what is already serving
    cold = forecast(state, small, NOW, ready_replicas={})
    assert [t.replicas for t in cold.targets] == [1]


def _embedding_state(per_minute: list[int]) -> fold.DemandState:
    state = fold.initial()
    for minute, n in enumerate(per_minute):
        t = NOW - 60 * len(per_minute) + minute * 60 + 30
        records = tuple(RequestFeatures(endpoint="embeddings", requested_model="auto", auto=True, workload="embedding",
                                        service_seconds=0.3, finished_at=t) for _ in range(n))
        if records:
            state = fold.apply(state, RequestBatch(event_id=f"e{minute}", at=t, source="t", records=records), t,
                               frozenset({"embed"}))
    return state


EMBED = [ModelProfile(model_id="embed", memory_mb=1_000, workload_scores={"embedding": 1.0}, replica_concurrency=8,
                      embeddings=True)]


def test_a_steady_cheap_workload_is_admitted() -> None:
    # Two 0.3 s embedding calls a minute is 0.01 concurrency at most: below the offered floor,
    # but live, observed demand. Before, it stayed below the gate and was never served.
    fc = forecast(_embedding_state([2] * 10), EMBED, NOW)
    [row] = [w for w in fc.workloads if w.workload == "embedding"]
    assert row.status == "admitted" and row.model_id == "embed"
    assert [t.model_id for t in fc.targets] == ["embed"]


def test_stale_observations_still_do_not_admit() -> None:
    # Three requests long ago and nothing since: the floor still keeps them from loading a model.
    fc = forecast(_embedding_state([3] + [0] * 12), EMBED, NOW)
    [row] = [w for w in fc.workloads if w.workload == "embedding"]
    assert row.status == "below_evidence_gate" and not fc.targets
