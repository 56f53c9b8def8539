"""What the scorer protocol promises the indexed search (grid/planner/scorer.py): every plain
host of a class scores as its class and bucket say, and no member beats its class's or its
bucket's bound. Checked on the ledger a finished plan leaves (domains in use, memory taken)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from grid.fleet.planning import PlannerInput
from grid.planner import scorers
from grid.planner.placement import Placer

from .builders import host, mk, prof, res, want
from .test_properties import SETTINGS, any_inputs, class_heavy_inputs


def check_plain_hosts(inp: PlannerInput) -> int:
    """Assert the promises for every (model, plain host of an eligible class); how many held."""
    placer = Placer(inp)
    placer.run()
    led = placer.ledger
    checked = 0
    for ms in led.models:
        for hs in led.hosts:
            if hs.idx in ms.special_set or hs.bucket is None or hs.cls.idx not in ms.class_mem:
                continue
            _, mem = ms.class_mem[hs.cls.idx]
            own = scorers.host_values(led, hs, ms, mem, None)
            of_class = led.class_values(hs.cls, ms)
            shared = of_class + scorers.bucket_values(hs.bucket)
            assert scorers.plain_host_values(led, hs, ms, mem, of_class) == own
            assert scorers.bucket_host_values(led, hs, ms, mem, shared) == own
            total = scorers.combine(own, ms.boost)
            in_bucket = scorers.combine(scorers.bucket_bound(shared), ms.boost)
            assert total <= in_bucket <= scorers.combine(scorers.class_bound(of_class), ms.boost)
            checked += 1
    return checked


def test_plain_hosts_score_as_their_class_and_bucket():
    hosts = [
        host("a1", 16_000, domain="a", bw=400.0, gflops=900.0, queue=5),
        host("a2", 24_000, domain="a", bw=400.0, gflops=900.0),
        host("b1", 16_000, domain="b", bw=100.0, state="throttled"),
        host("b2", 16_000, domain="b", bw=100.0, tps={"m": 40.0}),
        host("c1", 16_000, domain="c", residencies=(res("n", 4_000),)),
        host("c2", 16_000, domain="c", residencies=(res("m", 4_000, "failed"),)),
        host("c3", 16_000, domain="c"),
    ]
    inp = mk(
        [
            prof("m", 4_000, max_replicas=2, min_failure_domains=2, artifact_sha256="a" * 64),
            prof("n", 6_000, priority=1),
            prof("o", 2_000, max_replicas=3),
        ],
        hosts,
        [want("m", 2, offered_concurrency=10.0), want("n", 1), want("o", 3)],
    )
    assert check_plain_hosts(inp) > 0


@SETTINGS
@given(st.one_of(any_inputs(), class_heavy_inputs()))
def test_the_protocol_holds_on_random_fleets(inp):
    check_plain_hosts(inp)
