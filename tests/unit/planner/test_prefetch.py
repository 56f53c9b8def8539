"""Predictive cache in the plan: cache-only advisories and the expiry of unused downloads."""

from __future__ import annotations

import msgspec
from msgspec import UNSET

from grid.events.codec import encode_value
from grid.events.host import CachedArtifact
from grid.fleet import reasons as R
from grid.fleet.planning import Policy, TimingSample, encode_plan
from grid.fleet.views import HostView
from grid.planner.explain import render_explanation
from grid.planner.plan import plan

from .builders import GB, host, mk, prof, res, want

SHA_B = "b" * 64
SHA_C = "c" * 64
SHA_D = "d" * 64
ALL = ("load", "warm", "drain", "unload", "evict")
TTL = Policy().predictive_cache_ttl_seconds


def cap(h: HostView, caps: tuple[str, ...] = ALL) -> HostView:
    return msgspec.structs.replace(h, actuator_capabilities=caps)


def full(hid: str, disk: int | None = 30 * GB, caps: tuple[str, ...] = ALL, **kw) -> HostView:
    """A host whose memory a ready direct model holds: a 12 GB prediction cannot get a slot."""
    return cap(host(hid, residencies=(res("a", 8_000),), disk_free=disk, **kw), caps)


A = prof("a", 8_000, min_replicas=0, max_replicas=4)


def predicted(mid: str, sha: str, size_mb: int, mem: int = 12_000, **kw):
    kw.setdefault("artifact_source", f"https://models.example/{mid}.gguf")
    return prof(mid, mem, min_replicas=0, max_replicas=1, artifact_sha256=sha, artifact_size_mb=size_mb, **kw)


def demand(*inferred: tuple[str, float], direct_hosts: int = 2):
    return [want("a", direct_hosts)] + [want(m, 1, "inferred", offered_concurrency=c) for m, c in inferred]


def test_correlation_only_prediction_without_slot_gets_one_cache_only_advisory() -> None:
    b = predicted("b", SHA_B, 5_000)
    p = plan(mk([A, b], [full("h1"), full("h2", disk=20 * GB)], demand(("b", 0.5))))
    assert [(x.model_id, x.host_id) for x in p.placements] == [("a", "h1"), ("a", "h2")]
    assert len(p.prefetch) == 1
    adv = p.prefetch[0]
    assert (adv.model_id, adv.host_id, adv.reason) == ("b", "h1", R.PREDICTIVE_PREFETCH)
    assert adv.artifact_sha256 == SHA_B and adv.size_bytes == 5_000 << 20
    assert adv.value_per_mb > 0
    # Never a slot or memory: the model stays unplaced, the advisory is data on the plan.
    assert not any(x.model_id == "b" for x in p.placements)
    assert any(line.startswith("prefetch b on h1: predictive_prefetch") for line in render_explanation(p))


def test_no_advisory_for_direct_demand_or_a_placed_prediction() -> None:
    b = predicted("b", SHA_B, 5_000)
    hosts = [full("h1"), full("h2")]
    direct = plan(mk([A, b], hosts, [want("a", 2), want("b", 1, offered_concurrency=1.0)]))
    assert direct.prefetch == ()
    small = predicted("b", SHA_B, 5_000, mem=2_000)
    placed = plan(mk([A, small], hosts, demand(("b", 0.5))))
    assert any(x.model_id == "b" for x in placed.placements) and placed.prefetch == ()


def test_missing_disk_telemetry_never_authorizes_a_transfer() -> None:
    b = predicted("b", SHA_B, 5_000)
    p = plan(mk([A, b], [full("h1", disk=None), full("h2", disk=None)], demand(("b", 0.5))))
    assert p.prefetch == ()


def test_no_exact_source_sha_or_size_no_advisory() -> None:
    hosts = [full("h1"), full("h2")]
    for b in (
        predicted("b", SHA_B, 5_000, artifact_source=None),
        prof("b", 12_000, min_replicas=0, artifact_source="https://x/b", artifact_size_mb=5_000),
        prof("b", 12_000, min_replicas=0, artifact_source="https://x/b", artifact_sha256=SHA_B),
    ):
        assert plan(mk([A, b], hosts, demand(("b", 0.5)))).prefetch == ()


def test_host_must_advertise_load_and_not_hold_the_artifact() -> None:
    b = predicted("b", SHA_B, 5_000)
    no_load = full("h1", caps=("warm", "drain", "unload"))
    cached = full("h2", cached=(CachedArtifact(model_id="b", sha256=SHA_B, size_bytes=5_000 << 20),))
    assert plan(mk([A, b], [no_load, cached], demand(("b", 0.5)))).prefetch == ()


def test_reserve_counts_this_plans_placements_first() -> None:
    reserve = Policy().predictive_disk_reserve_bytes
    b = predicted("b", SHA_B, 5_000)
    # 10 GiB reserve + 5000 MB artifact: 15 GB free is just enough on an idle disk...
    edge = reserve + (5_000 << 20)
    ok = plan(mk([A, b], [full("h1", disk=edge), full("h2", disk=edge - 1)], demand(("b", 0.5))))
    assert [x.host_id for x in ok.prefetch] == ["h1"]
    assert ok.prefetch[0].disk_free_after_bytes == reserve
    # ...but not once this plan places a model whose 1000 MB download lands there first.
    e = prof("e", 1_000, min_replicas=1, artifact_sha256=SHA_D, artifact_source="https://x/e", artifact_size_mb=1_000,
             allow_hosts=("h1",))
    blocked = plan(mk([A, b, e], [full("h1", disk=edge), full("h2", disk=edge - 1)], demand(("b", 0.5)) + [want("e", 1)]))
    assert any(x.model_id == "e" and x.host_id == "h1" for x in blocked.placements)
    assert blocked.prefetch == ()


def test_budget_bounds_the_advisories_per_plan() -> None:
    models = [predicted(m, s, 2_000) for m, s in (("b", SHA_B), ("c", SHA_C), ("d", SHA_D))]
    hosts = [full("h1", disk=200 * GB), full("h2", disk=200 * GB)]
    dem = demand(("b", 1.0), ("c", 2.0), ("d", 3.0))
    p = plan(mk([A, *models], hosts, dem))
    assert [x.model_id for x in p.prefetch] == ["d", "c"]  # default bound 2, best value first
    one = plan(mk([A, *models], hosts, dem, policy=Policy(max_prefetch_per_plan=1)))
    assert [x.model_id for x in one.prefetch] == ["d"]
    assert plan(mk([A, *models], hosts, dem, policy=Policy(max_prefetch_per_plan=0))).prefetch == ()


def test_ranking_is_recomputed_after_each_choice() -> None:
    """b is worth most on h1 (its learned transfer there is slow); once c takes h1's disk, b's
    value on h2 (learned fast) falls below d's, so d is chosen second, not b."""
    reserve = Policy().predictive_disk_reserve_bytes
    b, c, d = predicted("b", SHA_B, 2_000), predicted("c", SHA_C, 2_000), predicted("d", SHA_D, 2_000)
    h1 = full("h1", disk=reserve + (2_000 << 20))  # room for exactly one transfer
    h2 = full("h2", disk=200 * GB)
    timings = (
        TimingSample(host_id="h1", model_id="b", artifact_sha256=SHA_B, load_seconds=300.0, samples=5),
        TimingSample(host_id="h1", model_id="c", artifact_sha256=SHA_C, load_seconds=400.0, samples=5),
        TimingSample(host_id="h2", model_id="b", artifact_sha256=SHA_B, load_seconds=5.0, samples=5),
    )
    dem = demand(("b", 1.0), ("c", 1.0), ("d", 1.0))
    alone = plan(mk([A, b, d], [h1, h2], dem[:2] + dem[3:], timings=timings))
    assert [(x.model_id, x.host_id) for x in alone.prefetch] == [("b", "h1"), ("d", "h2")]
    p = plan(mk([A, b, c, d], [h1, h2], dem, timings=timings))
    assert [(x.model_id, x.host_id) for x in p.prefetch] == [("c", "h1"), ("d", "h2")]
    # Without the recomputation b would still carry its h1 value (300 s) and beat d (30 s).
    assert p.prefetch[1].load_seconds == 30.0


def test_same_input_bytes_same_plan_bytes() -> None:
    models = [predicted(m, s, 2_000) for m, s in (("b", SHA_B), ("c", SHA_C))]
    inp = mk([A, *models], [full("h1", disk=100 * GB), full("h2", disk=100 * GB)], demand(("b", 1.0), ("c", 1.0)))
    again = msgspec.json.decode(encode_value(inp), type=type(inp))
    first = encode_plan(plan(inp))
    assert first == encode_plan(plan(again))
    assert plan(inp).prefetch  # the comparison covers advisories


# --- expiry -----------------------------------------------------------------------------------


def art(mid: str, sha: str, *, predictive: bool = True, age: float | None = TTL) -> CachedArtifact:
    return CachedArtifact(model_id=mid, sha256=sha, size_bytes=3_000 << 20, predictive=predictive,
                          cached_age_seconds=UNSET if age is None else age)


def test_unused_predictive_entry_past_ttl_without_demand_is_evicted_exactly() -> None:
    b = predicted("b", SHA_B, 3_000)
    h = cap(host("h1", cached=(art("b", SHA_B),)))
    p = plan(mk([b], [h], ()))
    assert [(e.host_id, e.model_id, e.artifact_sha256, e.reason) for e in p.evictions] == [
        ("h1", "b", SHA_B, R.PREDICTIVE_CACHE_EXPIRED)]
    assert p.evictions[0].size_bytes == 3_000 << 20
    assert any(line.startswith("evict b on h1: predictive_cache_expired") for line in render_explanation(p))


def test_ttl_boundary() -> None:
    b = predicted("b", SHA_B, 3_000)
    young = cap(host("h1", cached=(art("b", SHA_B, age=TTL - 0.001),)))
    assert plan(mk([b], [young], ())).evictions == ()
    exact = cap(host("h1", cached=(art("b", SHA_B, age=TTL),)))
    assert len(plan(mk([b], [exact], ())).evictions) == 1
    short = Policy(predictive_cache_ttl_seconds=60.0)
    minute = cap(host("h1", cached=(art("b", SHA_B, age=60.0),)))
    assert len(plan(mk([b], [minute], (), policy=short)).evictions) == 1


def test_never_evicted_operator_cache_unknown_age_no_actuator_demand_or_residency() -> None:
    b = predicted("b", SHA_B, 3_000, mem=2_000)
    cases = [
        cap(host("h1", cached=(art("b", SHA_B, predictive=False),))),  # operator cache
        cap(host("h1", cached=(art("b", SHA_B, age=None),))),  # older agent: age unknown
        cap(host("h1", cached=(art("b", SHA_B),)), ("load", "warm", "drain", "unload")),  # no evict
        cap(host("h1", cached=(art("b", SHA_B),), residencies=(res("b", 2_000),))),  # resident
    ]
    for h in cases:
        assert plan(mk([b], [h], ())).evictions == (), h
    # Demand came back: the model is wanted again (here it is even placed on that host).
    h = cap(host("h1", cached=(art("b", SHA_B),)))
    again = plan(mk([b], [h], [want("b", 1)]))
    assert again.evictions == () and [x.host_id for x in again.placements] == ["h1"]
    # A profile with a baseline keeps its artifact too.
    based = predicted("b", SHA_B, 3_000, mem=2_000)
    based = msgspec.structs.replace(based, min_replicas=1)
    assert plan(mk([based], [cap(host("h1", 1_000, cached=(art("b", SHA_B),)))], ())).evictions == ()


def test_a_prediction_short_of_its_next_replica_is_advised_on_a_host_without_one() -> None:
    b = predicted("b", SHA_B, 5_000, mem=6_000)
    b = msgspec.structs.replace(b, max_replicas=3)
    # Room for one 6 GB replica on h1 only; h2 and h3 are full.
    h1 = cap(host("h1", residencies=(res("a", 8_000),), disk_free=30 * GB))
    hosts = [h1, full("h2", cap=14_000), full("h3", cap=14_000)]
    p = plan(mk([A, b], hosts, [want("a", 3), want("b", 2, "inferred", offered_concurrency=2.0)]))
    assert [x.host_id for x in p.placements if x.model_id == "b"] == ["h1"]
    assert [(x.model_id, x.host_id) for x in p.prefetch] == [("b", "h2")]


def test_a_prediction_with_a_spare_cached_host_gets_no_further_transfer() -> None:
    b = predicted("b", SHA_B, 5_000)
    spare = full("h2", cached=(CachedArtifact(model_id="b", sha256=SHA_B, size_bytes=5_000 << 20, predictive=True,
                                              cached_age_seconds=60.0),))
    p = plan(mk([A, b], [full("h1"), spare, full("h3")], demand(("b", 0.5), direct_hosts=3)))
    assert p.prefetch == () and p.evictions == ()


def test_a_host_claiming_provenance_can_expire_only_its_own_entry() -> None:
    """A hostile enrolled host may report anything about its own disk: its claim of a predictive
    entry never plans an eviction on another host, whose own heartbeat shows an operator cache."""
    b = predicted("b", SHA_B, 3_000)
    liar = cap(host("h1", cached=(art("b", SHA_B),)))
    honest = cap(host("h2", cached=(art("b", SHA_B, predictive=False),)))
    p = plan(mk([b], [liar, honest], ()))
    assert [(e.host_id, e.artifact_sha256) for e in p.evictions] == [("h1", SHA_B)]
