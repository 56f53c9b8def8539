"""Flap quarantine: the rule over transition times, the lifecycle fold that records them, and the
planner obeying it (new placement only; a last ready replica is never taken away)."""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from grid.controller.inputs import Observation, build_planner_input
from grid.events.host import HostHeartbeat, HostResources, Residency
from grid.fleet import quarantine as Q
from grid.fleet import reasons as R
from grid.fleet.planning import FlapQuarantine, Policy, encode_plan
from grid.planner.plan import plan
from grid.projections import catalog as catalog_proj
from grid.projections import fleet as fleet_proj
from grid.projections import lifecycle as lifecycle_proj
from grid.projections.actions import ActionsState
from grid.projections.position import Position
from tests.unit.planner.builders import NOW, host, mk, on, prof, res, shortfall_reasons, want
from tests.unit.planner.test_properties import any_inputs

POLICY = Policy()
W, N, BASE, CAP = POLICY.flap_window_seconds, POLICY.flap_host_transitions, POLICY.flap_backoff_seconds, \
    POLICY.flap_backoff_max_seconds


def active(times, now, **kw):
    args = dict(window=W, threshold=N, base=BASE, cap=CAP) | kw
    return Q.active("host", "h1", times, now, **args)


# --- the rule -------------------------------------------------------------------------------------


def test_n_transitions_within_the_window_quarantine_from_the_nth():
    times = [1000.0 + 120 * i for i in range(N)]
    assert active(times[:-1], times[-2] + 1) is None  # one short of the threshold
    q = active(times, times[-1])
    assert q is not None and q.since == times[-1] and q.until == times[-1] + BASE
    assert q.reason == R.FLAP_QUARANTINE and q.transitions == N and q.level == 0
    assert active(times, times[-1] + BASE) is None  # released automatically


def test_transitions_spread_wider_than_the_window_never_quarantine():
    times = [1000.0 + (W / (N - 1)) * 1.01 * i for i in range(3 * N)]
    assert all(active(times, t) is None for t in times)


def test_the_backoff_doubles_while_flapping_goes_on_and_is_capped():
    # A flap every 2 minutes for 6 hours: each quarantine starts at the first flap after a release.
    times = [1000.0 + 120 * i for i in range(180)]
    eps = Q.episodes(times, window=W, threshold=N, base=BASE, cap=CAP)
    backoffs = [until - since for since, until, _, _ in eps]
    assert backoffs[:4] == [BASE, 2 * BASE, 4 * BASE, CAP][: len(backoffs[:4])]
    assert max(backoffs) == CAP
    assert [lvl for _, _, lvl, _ in eps] == list(range(len(eps)))


def test_a_quiet_spell_longer_than_the_cap_resets_the_level():
    first = [1000.0 + 120 * i for i in range(N)]
    later = [first[-1] + BASE + CAP + 1 + 120 * i for i in range(N)]
    eps = Q.episodes(first + later, window=W, threshold=N, base=BASE, cap=CAP)
    assert [lvl for _, _, lvl, _ in eps] == [0, 0]


def test_zero_threshold_turns_quarantine_off():
    times = [1000.0 + 10 * i for i in range(50)]
    assert active(times, times[-1], threshold=0) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=50_000, allow_nan=False), max_size=60),
       st.floats(min_value=0, max_value=60_000, allow_nan=False))
def test_always_released_after_its_backoff(times, now):
    q = active(times, now)
    if q is None:
        return
    assert q.since <= now < q.until <= q.since + max(CAP, BASE)
    # With nothing new after it, the quarantine is over at its release time and stays over.
    quiet = [t for t in times if t <= now]
    assert active(quiet, q.until) is None
    assert active(quiet, max(quiet) + max(CAP, BASE)) is None


# --- the fold -------------------------------------------------------------------------------------

RES = HostResources(capacity_mb=16_000)


def hb(host_id: str, state: str = "accepting", residencies=()) -> HostHeartbeat:
    return HostHeartbeat(event_id="e", at=0.0, host_id=host_id, state=state, resources=RES,
                         residencies=tuple(residencies))


def fold(events):
    state = lifecycle_proj.initial()
    for seq, (at, ev) in enumerate(events, start=1):
        state = lifecycle_proj.apply(state, ev, Position("GRID_HOSTS", seq, at))
    return state


def test_silence_and_return_are_two_transitions_a_state_change_one():
    s = fold([(0.0, hb("h1")), (10.0, hb("h1")), (300.0, hb("h1")), (310.0, hb("h1", "throttled")),
              (320.0, hb("h1", "throttled"))])
    assert lifecycle_proj.host_transitions(s) == {"h1": (10.0 + lifecycle_proj.SILENCE_SECONDS, 300.0, 310.0)}


def test_a_residency_failing_counts_for_its_model_once_per_failure():
    ready = Residency(model_id="m", memory_mb=100, state="ready")
    failed = Residency(model_id="m", memory_mb=100, state="failed")
    s = fold([(0.0, hb("h1", residencies=[ready])), (10.0, hb("h1", residencies=[failed])),
              (20.0, hb("h1", residencies=[failed])), (30.0, hb("h1", residencies=[ready])),
              (40.0, hb("h1", residencies=[failed]))])
    assert lifecycle_proj.model_transitions(s) == {"m": (10.0, 40.0)}
    assert lifecycle_proj.host_transitions(s) == {}


def _alternating(start: float, every: float, n: int, flip_every: int = 1):
    """Heartbeats every `every` seconds whose state flips every `flip_every` heartbeats."""
    return [(start + every * i, hb("h1", "throttled" if (i // flip_every) % 2 else "accepting")) for i in range(n)]


def test_an_older_heartbeat_is_ignored_and_history_is_bounded_by_time_and_count():
    # A flip every 200 s for 14 hours: only the last HISTORY_SECONDS are kept.
    s = fold(_alternating(0.0, 50.0, 14 * 72, flip_every=4))
    kept = s.hosts["h1"].transitions
    assert kept[0] > s.hosts["h1"].last_at - Q.HISTORY_SECONDS >= kept[0] - 200.0
    # A flip every 10 s: the count bound holds.
    s = fold(_alternating(0.0, 10.0, 2 * lifecycle_proj.MAX_TRANSITIONS))
    assert len(s.hosts["h1"].transitions) == lifecycle_proj.MAX_TRANSITIONS
    again = lifecycle_proj.apply(s, hb("h1", "paused"), Position("GRID_HOSTS", 5, 99_999.0))
    assert again is s


def test_quarantines_depend_on_the_recent_log_not_on_where_the_fold_began():
    # Nine hours of a host flapping in bursts (a throttle storm every 40 minutes). A fold of the
    # whole log and one that began three quarters of the way in (more than a lookback before the
    # plans below) plan with the same quarantines: a controller that followed the log since
    # before retention trimmed it agrees with a replay of what is left, or of an export window.
    events = []
    for burst in range(14):
        events += _alternating(burst * 2400.0, 20.0, 30 if burst % 3 else 8)
    whole = fold(events)
    cut = [e for e in events if e[0] >= 3 * 3600.0]
    late = fold(cut)
    horizon = Q.lookback(window=W, base=BASE, cap=CAP)
    nows = [t for t, _ in events if t >= cut[0][0] + horizon]
    assert nows
    seen = set()
    for now in nows[::5]:
        a = Q.quarantines(lifecycle_proj.host_transitions(whole), {}, now, POLICY)
        b = Q.quarantines(lifecycle_proj.host_transitions(late), {}, now, POLICY)
        assert a == b, now
        seen.update(q.level for q in a)
    assert seen and max(seen) > 0  # quarantines were in force, and their backoff had doubled


# --- planner input, plan and status ---------------------------------------------------------------


def _states(events):
    fleet = fleet_proj.initial()
    for seq, (at, ev) in enumerate(events, start=1):
        fleet = fleet_proj.apply(fleet, ev, Position("GRID_HOSTS", seq, at))
    return Observation(catalog=catalog_proj.initial(), fleet=fleet, actions=ActionsState(), lifecycle=fold(events))


def test_the_planner_input_carries_the_quarantine_deterministically():
    # Down 2 of every 6 minutes: heartbeats every 10 s while up.
    events = []
    t = 0.0
    for _ in range(4):
        for _ in range(24):
            events.append((t, hb("h1")))
            t += 10.0
        t += 120.0
    now = events[-1][0]
    a = build_planner_input(_states(events), now, policy=POLICY)
    b = build_planner_input(_states(events), now, policy=POLICY)
    assert [(q.kind, q.subject) for q in a.flap_quarantines] == [("host", "h1")]
    assert msgspec.json.encode(a) == msgspec.json.encode(b)
    off = build_planner_input(_states(events), now, policy=Policy(flap_host_transitions=0))
    assert off.flap_quarantines == ()


def quarantine(kind, subject):
    return FlapQuarantine(kind=kind, subject=subject, reason=R.FLAP_QUARANTINE, since=NOW - 60, until=NOW + 600)


def test_a_quarantined_host_keeps_its_incumbent_and_takes_new_work_only_as_last_resort():
    hosts = [host("h1", residencies=(res("a"),)), host("h2")]
    inp = mk([prof("a"), prof("b")], hosts, [want("a", 1), want("b", 1)],
             flap_quarantines=(quarantine("host", "h1"),))
    p = plan(inp)
    assert on(p, "a", "existing") == ["h1"]
    assert on(p, "b", "new") == ["h2"]  # h1 has room too, but it flaps
    # With no other host, the flapping one still takes the replica: quarantine never costs service.
    p = plan(mk([prof("b")], [host("h1")], [want("b", 1)], flap_quarantines=(quarantine("host", "h1"),)))
    assert on(p, "b", "new") == ["h1"]


def test_a_quarantined_model_keeps_its_ready_replica_and_gets_no_new_one():
    hosts = [host("h1", residencies=(res("a"),)), host("h2")]
    p = plan(mk([prof("a", max_replicas=3)], hosts, [want("a", 2)], flap_quarantines=(quarantine("model", "a"),)))
    assert on(p, "a") == ["h1"]
    assert R.FLAP_QUARANTINE in shortfall_reasons(p, "a")
    assert not p.preemptions


def test_a_quarantined_model_with_no_replica_still_gets_one():
    # A crash loop is slowed to one replica at a time; demand is never left with nothing.
    p = plan(mk([prof("a", max_replicas=3)], [host("h1"), host("h2")], [want("a", 2)],
                flap_quarantines=(quarantine("model", "a"),)))
    assert len(on(p, "a", "new")) == 1
    assert R.FLAP_QUARANTINE in shortfall_reasons(p, "a")


def test_host_quarantine_never_costs_a_replica():
    # Held out of h1, the greedy order fills the throttled h0 (half of it offered) with a and b,
    # and c's second replica has nowhere to go; without the hold every replica fits. The plan
    # is then the one without host quarantine.
    hosts = [host("h0", 8_000, state="throttled"), host("h1", 8_000)]
    profiles = [prof("a", 2_000), prof("b", 2_000), prof("c", 2_000, max_replicas=2)]
    demand = [want("a", 1), want("b", 1), want("c", 2)]
    free = plan(mk(profiles, hosts, demand))
    held = plan(mk(profiles, hosts, demand, flap_quarantines=(quarantine("host", "h1"),)))
    assert sorted(on(free, "c")) == ["h0", "h1"]
    assert [(x.model_id, x.host_id) for x in held.placements] == [(x.model_id, x.host_id) for x in free.placements]
    # Where the hold costs nothing, it holds: the flapping host gets no new replica.
    light = plan(mk(profiles[:2], [host("h0"), host("h1")], demand[:2],
                    flap_quarantines=(quarantine("host", "h1"),)))
    assert on(light, "a") == on(light, "b") == ["h0"]


@st.composite
def with_quarantines(draw):
    inp = draw(any_inputs())
    hosts = sorted({h.host_id for h in inp.hosts})
    models = sorted({p.model_id for p in inp.profiles})
    qs = [quarantine("host", h) for h in hosts if draw(st.booleans())]
    qs += [quarantine("model", m) for m in models if draw(st.booleans())]
    return inp, tuple(qs)


def _last_ready(inp):
    """(model, host) of every model with exactly one ready managed unpinned residency."""
    seen: dict[str, list[str]] = {}
    for h in inp.hosts:
        for r in h.residencies:
            if r.state == "ready" and r.managed and not r.pinned:
                seen.setdefault(r.model_id, []).append(h.host_id)
    return {(m, hs[0]) for m, hs in seen.items() if len(hs) == 1}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink))
@given(with_quarantines())
def test_quarantine_keeps_what_it_holds_and_never_costs_a_replica(case):
    inp, qs = case
    free = plan(inp)
    held = plan(msgspec.structs.replace(inp, flap_quarantines=qs))
    models_only = plan(msgspec.structs.replace(inp, flap_quarantines=tuple(q for q in qs if q.kind == "model")))

    def kept(p, m, h):
        placed = any(x.model_id == m and x.host_id == h and x.status == "existing" for x in p.placements)
        drained = any(x.victim_model == m and x.host_id == h for x in p.preemptions)
        return placed and not drained

    def replicas(p, m):
        return sum(1 for x in p.placements if x.model_id == m)

    held_hosts = Q.quarantined(qs, "host")
    held_models = Q.quarantined(qs, "model")
    for m, h in _last_ready(inp):
        # What quarantine holds keeps what it has: a last ready replica on a quarantined host, or
        # of a quarantined model, stays wherever the plan without quarantine keeps it.
        if kept(free, m, h) and (h in held_hosts or m in held_models):
            assert kept(held, m, h), (m, h, [(q.kind, q.subject) for q in qs], held.preemptions,
                                      [x for x in held.placements if x.model_id == m], inp)
    for m in {p.model_id for p in inp.profiles}:
        # Host quarantine never costs a replica.
        assert replicas(held, m) >= replicas(models_only, m), m
        # A quarantined model gets a new replica only when it has no other one (a copy kept only
        # until it is replaced, on a host it no longer fits, is not one: its replacement is).
        if m in held_models:
            new = [x for x in held.placements if x.model_id == m and x.status == "new"]
            kept_until_replaced = sum(1 for x in held.placements
                                      if x.model_id == m and x.reason == R.RETAINED_UNTIL_REPLACED)
            assert len(new) <= 1 and (not new or replicas(held, m) - kept_until_replaced == 1), (m, held.placements)
    # A quarantined model's replica is never a preemption victim (it could not come back).
    assert not [x for x in held.preemptions if x.reason == R.PRIORITY_PREEMPTION and x.victim_model in held_models]
    assert encode_plan(held) == encode_plan(plan(msgspec.structs.replace(inp, flap_quarantines=qs)))


def test_status_and_the_status_table_show_which_subject_why_and_until_when(monkeypatch):
    from grid.cli.admin import _render_quarantines
    from grid.cli.common import console
    from grid.controller.status import quarantine_rows

    pin = mk([prof("a")], [host("h1")], flap_quarantines=(quarantine("host", "h1"),))
    rows = quarantine_rows(pin, NOW)
    assert rows == [{"kind": "host", "subject": "h1", "reason": R.FLAP_QUARANTINE, "since": NOW - 60,
                     "until": NOW + 600, "transitions": 0, "level": 0, "remaining_seconds": 600.0}]
    assert quarantine_rows(None, NOW) == []
    msgspec.json.encode(rows)  # the --json document encodes as is
    # Whole values, whatever width the test process's terminal (or COLUMNS) gives the console.
    monkeypatch.setattr(console, "width", 400)
    with console.capture() as cap:
        _render_quarantines(rows)
    text = cap.get()
    assert "h1" in text and R.FLAP_QUARANTINE in text and "UTC" in text and "10m" in text


def test_the_controller_gauge_reads_the_last_ticks_quarantines_at_scrape_time():
    from grid.controller.quarantine_metrics import NAME, quarantine_gauge
    from grid.metrics import ControllerMetrics, exposition
    from tests.unit.test_metrics import parse

    state = {"pin": None, "now": NOW}
    m = ControllerMetrics([quarantine_gauge(lambda: state["pin"], lambda: state["now"])])
    assert NAME not in parse(exposition(m.registry))
    state["pin"] = mk([prof("a")], [host("h1")], flap_quarantines=(quarantine("host", "h1"), quarantine("model", "a")))
    state["now"] = NOW + 100
    got = parse(exposition(m.registry))[NAME]
    assert sorted(got, key=str) == [({"kind": "host", "subject": "h1"}, 500.0),
                                    ({"kind": "model", "subject": "a"}, 500.0)]
