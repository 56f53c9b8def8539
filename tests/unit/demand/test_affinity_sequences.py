import pytest

from grid.events.codec import encode_value
from grid.demand import affinity as af
from grid.demand.forecast import GATE_SEQUENCE, forecast
from grid.demand import fold as dm

from tests.unit.demand.fc_helpers import T0, at, auto, fold, profile, target, wrow

CONF = frozenset({"painter", "animator"})
CATALOG = [
    profile("painter", workload_scores={"image": 0.9}),
    profile("animator", workload_scores={"video": 0.9}, expected_service_seconds=60.0),
]


def session(state, key, steps, start_bucket=0, t0=1.0):
    """One workflow: `steps` workloads in order, each a completion a few seconds apart."""
    for i, w in enumerate(steps):
        state = fold(state, at(start_bucket, t0 + i), [auto(w, affinity=key, finished_at=T0 + start_bucket * 60 + t0 + i)], CONF)
    return state


def test_five_repeated_transitions_are_required():
    s = dm.initial()
    for k in range(4):
        s = session(s, f"k{k}", ["image", "video"])
    assert af.edges(s.affinity, at(0, 30.0)) == ()
    s = session(s, "k4", ["image", "video"])
    (e,) = af.edges(s.affinity, at(0, 30.0))
    assert (e.source, e.target, e.count, e.departures, e.confidence) == ("image", "video", 5, 5, 1.0)


def test_confidence_includes_every_departure_from_the_source():
    s = dm.initial()
    for k in range(5):
        s = session(s, f"v{k}", ["image", "video"])
    for k in range(5):
        s = session(s, f"i{k}", ["image", "image"])
    edges = {(e.source, e.target): e for e in af.edges(s.affinity, at(0, 30.0))}
    assert edges[("image", "video")].confidence == pytest.approx(0.5)
    assert edges[("image", "video")].departures == 10


def test_unrelated_users_adjacent_traffic_is_not_sequence_evidence():
    s = dm.initial()
    for k in range(20):
        s = session(s, f"img{k}", ["image"])
        s = session(s, f"vid{k}", ["video"])
    assert af.edges(s.affinity, at(0, 30.0)) == ()
    s = fold(s, at(0, 40.0), [auto("image") for _ in range(20)] + [auto("video") for _ in range(20)], CONF)
    assert af.edges(s.affinity, at(0, 40.0)) == ()


def test_out_of_order_and_simultaneous_completions_update_aggregates_only():
    s = dm.initial()
    for k in range(6):
        key = f"k{k}"
        s = fold(s, at(0, 10.0), [auto("video", affinity=key, finished_at=100.0)], CONF)
        # The image step finished earlier but its callback arrived later.
        s = fold(s, at(0, 11.0), [auto("image", affinity=key, finished_at=90.0)], CONF)
        # A simultaneous completion cannot order either.
        s = fold(s, at(0, 12.0), [auto("image", affinity=key, finished_at=100.0)], CONF)
    assert af.edges(s.affinity, at(0, 20.0)) == ()
    b = s.workloads["image"].by_index()[int(at(0) // 60)]
    assert b.count == 12  # aggregate demand still counted


def test_caps_and_double_hashing():
    s = dm.initial()
    records = [auto("image", affinity=f"raw-key-{i:05d}", finished_at=float(i)) for i in range(5000)]
    s = fold(s, at(0), records, CONF)
    assert len(s.affinity.cursors) <= af.MAX_WORKFLOWS
    encoded = encode_value(s)
    assert b"raw-key-" not in encoded
    assert af.rehash("raw-key-04999") in s.affinity.cursors
    assert af.rehash("x") != "x" and len(af.rehash("x")) == 32
    st = af.AffinityState()
    vocab = [f"w{i}" for i in range(100)]
    t = T0
    for i in range(100):
        for j in range(100):
            t += 1.0
            af.record_completion(st, f"k{i}-{j}", vocab[i], t, t)
            af.record_completion(st, f"k{i}-{j}", vocab[j], t + 0.5, t)
    assert len(st.transitions) <= af.MAX_TRANSITIONS
    assert len(st.cursors) <= af.MAX_WORKFLOWS


def test_one_hour_expiry():
    s = dm.initial()
    for k in range(5):
        s = session(s, f"k{k}", ["image", "video"])
    assert len(af.edges(s.affinity, at(60, 0.0))) == 1
    assert af.edges(s.affinity, at(61, 5.0)) == ()
    # A cursor older than an hour cannot start a transition.
    s2 = session(dm.initial(), "late", ["image"])
    s2 = fold(s2, at(61, 30.0), [auto("video", affinity="late", finished_at=T0 + 61 * 60 + 30)], CONF)
    assert s2.affinity.transitions == {}


def test_learned_sequence_prewarms_the_next_workloads_model():
    s = dm.initial()
    for k in range(6):
        s = session(s, f"camp{k}", ["image", "video"], start_bucket=0)
    # Hours of quiet later? No: a new campaign starts its image step now.
    s = session(s, "camp-new", ["image"], start_bucket=2)
    fc = forecast(s, CATALOG, at(2, 30.0))
    w = wrow(fc, "video")
    assert w.gate in (GATE_SEQUENCE, "observations")
    t = target(fc, "animator")
    assert t is not None and t.evidence == "inferred"
    pred = next(p for p in fc.predictions if p.target == "video")
    assert pred.source == "image" and pred.confidence == pytest.approx(1.0)


def test_sequence_alone_gives_a_one_replica_inferred_canary():
    s = dm.initial()
    for k in range(5):
        s = session(s, f"camp{k}", ["image", "video"], start_bucket=0)
    # Forty minutes later the video workload is quiet (below its gate) but a workflow is at image.
    s = session(s, "camp-new", ["image"], start_bucket=40)
    fc = forecast(s, CATALOG, at(40, 30.0))
    w = wrow(fc, "video")
    assert w.gate == GATE_SEQUENCE and w.sequence_source == "image"
    t = target(fc, "animator")
    assert (t.replicas, t.evidence, t.canary) == (1, "inferred", True)
    assert "sequence:image->video@1.00" in t.reason
