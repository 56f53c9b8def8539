"""The placed fold: the latest plan's managed assignments and each (host, model)'s latest warm ack."""

from __future__ import annotations

import itertools

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from grid.agent.outcomes import MSG_INTERRUPTED
from grid.events.host import HostResources
from grid.fleet.views import HostView, ResidencyView
from grid.projections import placed
from grid.projections.placed import REASON_ARTIFACT_MISMATCH, REASON_NO_WARM_ACK, REASON_NOT_IN_PLAN
from grid.projections.position import Position

from tests.integration.agent.agentkit import make_command
from tests.placement import plan_event, warm_ack

SHA = "ab" * 32
_seq = itertools.count(1)


def fold(*events, state=None):  # type: ignore[no-untyped-def]
    state = state or placed.initial()
    for ev in events:
        stream = {"PlanCreated": "GRID_PLANS", "CommandIssued": "GRID_CMDS"}.get(type(ev).__name__, "GRID_HOSTS")
        state = placed.apply(state, ev, Position(stream, next(_seq), 1000.0))
    return state


def res(model: str = "m", *, managed: bool = True, sha: str | None = SHA, state: str = "ready") -> ResidencyView:
    return ResidencyView(model_id=model, memory_mb=300, state=state, managed=managed, artifact_sha256=sha,
                         endpoint="http://h:1")


def judge(state: placed.PlacedState, host: str = "h", r: ResidencyView | None = None,
          profile_sha: str | None = SHA) -> str | None:
    return placed.verdict(state, host, r or res(), profile_sha)


def test_a_claim_the_plan_does_not_assign_is_not_corroborated_even_with_a_warm_ack() -> None:
    assert judge(placed.initial()) == REASON_NOT_IN_PLAN
    assert judge(fold(warm_ack("h", "m"))) == REASON_NOT_IN_PLAN
    # assigned elsewhere, or another model here: still not this pair
    assert judge(fold(plan_event([("other", "m"), ("h", "x")]), warm_ack("h", "m"))) == REASON_NOT_IN_PLAN


def test_placed_and_warm_acked_is_corroborated_and_a_later_drain_or_unload_withdraws_it() -> None:
    s = fold(plan_event([("h", "m")]))
    assert judge(s) == REASON_NO_WARM_ACK
    s = fold(warm_ack("h", "m"), state=s)
    assert judge(s) is None
    for kind in ("drain", "unload"):
        gone = fold(warm_ack("h", "m", kind=kind), state=s)
        assert judge(gone) == REASON_NO_WARM_ACK
        assert judge(fold(warm_ack("h", "m"), state=gone)) is None  # warmed again


def test_a_drain_or_unload_that_did_not_succeed_leaves_the_confirmation() -> None:
    s = fold(plan_event([("h", "m")]), warm_ack("h", "m"))
    for kind in ("drain", "unload"):
        for status in ("accepted", "failed", "rejected", "cancelled"):
            assert judge(fold(warm_ack("h", "m", kind=kind, status=status), state=s)) is None, (kind, status)


def test_which_warm_acks_confirm_a_started_child() -> None:
    s = fold(plan_event([("h", "m")]))
    # accepted: the warm passed fencing and started (an agent that lost its state file mid-warm
    # adopts the child and never sends a terminal ack)
    assert judge(fold(warm_ack("h", "m", status="accepted"), state=s)) is None
    # interrupted by a restart: recovery proves and adopts a surviving child
    interrupted = warm_ack("h", "m", status="failed", message=MSG_INTERRUPTED)
    assert judge(fold(warm_ack("h", "m", status="accepted"), interrupted, state=s)) is None
    # a warm that failed otherwise stopped its child; rejected/cancelled ones never ran
    ok = fold(warm_ack("h", "m"), state=s)
    assert judge(fold(warm_ack("h", "m", status="failed", message="readiness_timeout: 120s"), state=ok)) \
        == REASON_NO_WARM_ACK
    for status in ("rejected", "cancelled"):
        assert judge(fold(warm_ack("h", "m", status=status), state=ok)) is None
        assert judge(fold(warm_ack("h", "m", status=status), state=s)) == REASON_NO_WARM_ACK


def test_load_acks_and_acks_without_a_model_change_nothing() -> None:
    s = fold(plan_event([("h", "m")]))
    assert fold(warm_ack("h", "m", kind="load"), state=s) == s
    assert fold(msgspec.structs.replace(warm_ack("h", "m"), model_id=""), state=s) == s


def test_the_artifact_must_be_the_profiles_when_the_profile_names_one() -> None:
    s = fold(plan_event([("h", "m")]), warm_ack("h", "m"))
    assert judge(s, r=res(sha="cd" * 32)) == REASON_ARTIFACT_MISMATCH
    assert judge(s, r=res(sha=None)) == REASON_ARTIFACT_MISMATCH
    assert judge(s, r=res(sha=SHA.upper())) is None  # digests compare case-insensitively
    assert judge(s, r=res(sha=None), profile_sha=None) is None  # the profile names none


def test_external_residencies_are_unaffected() -> None:
    assert judge(placed.initial(), r=res(managed=False)) is None
    assert judge(placed.initial(), r=res(managed=False, sha="cd" * 32)) is None


def test_only_the_latest_plan_counts_and_its_unmanaged_placements_assign_nothing() -> None:
    s = fold(plan_event([("h", "m")], sequence=1), warm_ack("h", "m"))
    assert judge(s) is None
    later = placed.apply(s, plan_event([], sequence=2, unmanaged=[("h", "m")]), Position("GRID_PLANS", 10_000, 1.0))
    assert judge(later) == REASON_NOT_IN_PLAN
    # an older plan folded late (a side replay) does not bring the assignment back
    assert placed.apply(later, plan_event([("h", "m")]), Position("GRID_PLANS", 9_999, 1.0)) == later


def test_an_unreadable_plan_assigns_nothing() -> None:
    ev = msgspec.structs.replace(plan_event([("h", "m")]), plan=msgspec.Raw(b'{"placements": 7}'))
    s = fold(ev, warm_ack("h", "m"))
    assert not s.plan_readable and judge(s) == REASON_NOT_IN_PLAN
    assert fold(msgspec.structs.replace(ev, plan=msgspec.Raw(b"null"))).plan_readable


@settings(max_examples=200, deadline=None)
@given(st.permutations(range(6)))
def test_acks_folded_in_any_order_give_the_in_order_state(order: list[int]) -> None:
    """The gateway scans the hosts stream's older acks beside its live tail: order must not matter."""
    acks = [warm_ack("h", "m", status="accepted"), warm_ack("h", "m"), warm_ack("h", "m", kind="drain"),
            warm_ack("h2", "m"), warm_ack("h", "x"), warm_ack("h2", "m", kind="unload", status="failed")]
    in_order = placed.initial()
    for i, ack in enumerate(acks):
        in_order = placed.apply(in_order, ack, Position("GRID_HOSTS", i + 1, 1.0))
    shuffled = placed.initial()
    for i in order:
        shuffled = placed.apply(shuffled, acks[i], Position("GRID_HOSTS", i + 1, 1.0))
    assert shuffled == in_order


def test_one_entry_per_pair_and_bounded(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(placed, "MAX_PAIRS", 3)
    s = placed.initial()
    for i in range(10):
        s = placed.apply(s, warm_ack("h", "m"), Position("GRID_HOSTS", i + 1, 1.0))
    assert list(s.acks) == [placed.pair_key("h", "m")]
    s = placed.apply(s, warm_ack("h", "gone", kind="drain"), Position("GRID_HOSTS", 11, 1.0))
    for i, model in enumerate(("a", "b", "c")):
        s = placed.apply(s, warm_ack("h", model), Position("GRID_HOSTS", 12 + i, 1.0))
    # the withdrawn entry went first, then the oldest confirmation
    assert sorted(s.acks) == sorted(placed.pair_key("h", m) for m in ("a", "b", "c"))


def test_unplaced_claims_lists_managed_ready_and_warming_claims_with_their_reason() -> None:
    s = fold(plan_event([("h1", "m"), ("h1", "w"), ("h2", "m")]), warm_ack("h1", "m"))
    snap = HostView(host_id="h1", state="accepting", resources=HostResources(capacity_mb=1000), residencies=(
        res("m"), res("w", state="warming"), res("x"), res("ext", managed=False), res("old", state="draining")))
    snap2 = HostView(host_id="h2", state="accepting", resources=HostResources(capacity_mb=1000),
                         residencies=(res("m", sha="cd" * 32),))
    claims = placed.unplaced_claims(s, [snap, snap2], {"m": SHA, "w": None})
    assert [(c.host_id, c.model_id, c.state, c.reason) for c in claims] == [
        ("h1", "w", "warming", REASON_NO_WARM_ACK),
        ("h1", "x", "ready", REASON_NOT_IN_PLAN),
        ("h2", "m", "ready", REASON_NO_WARM_ACK),
    ]


def test_the_interrupted_message_is_the_agents() -> None:
    assert placed.INTERRUPTED_BY_RESTART == MSG_INTERRUPTED


def test_the_state_round_trips_through_a_snapshot() -> None:
    from grid.events import codec

    s = fold(plan_event([("h", "m")]), warm_ack("h", "m"))
    assert msgspec.json.decode(codec.encode_value(s), type=placed.PlacedState) == s


def test_a_plan_that_does_not_list_the_pair_as_corroborated_routes_nothing() -> None:
    s = fold(plan_event([("h", "m")], corroborated=()), warm_ack("h", "m"))
    assert judge(s) == placed.REASON_NOT_CORROBORATED


def test_only_an_ack_naming_a_command_the_controller_issued_corroborates() -> None:
    """The controller's fold: a host's ack of an action id of its own making corroborates
    nothing; its ack of the controller's warm (or load) command does, whatever the order."""
    warm = make_command(action_id="w1", kind="warm", host_id="h", model_id="m")
    assert placed.corroborated(fold(warm_ack("h", "m", action_id="made-up"), warm)) == ()
    assert placed.corroborated(fold(warm_ack("h", "m", action_id="w1"), warm)) == (("h", "m"),)
    assert placed.corroborated(fold(warm, warm_ack("h", "m", action_id="w1"))) == (("h", "m"),)
    drained = fold(warm, warm_ack("h", "m", action_id="w1"), warm_ack("h", "m", kind="drain"))
    assert placed.corroborated(drained) == ()
    unloads = fold(make_command(action_id="u1", kind="unload", host_id="h", model_id="m"))
    assert unloads.warms == {}


def test_a_replica_nobody_commanded_is_not_supply_but_its_memory_is_used() -> None:
    snap = HostView(host_id="h", state="accepting", resources=HostResources(capacity_mb=8000),
                        residencies=(res("m"), res("x", state="loading"), res("ext", managed=False),
                                     res("c", state="cached")),
                        unmanaged_memory_mb=100)
    s = fold(make_command(action_id="l1", kind="load", host_id="h", model_id="x"))
    seen = placed.without_uncommanded(snap, s)
    assert [r.model_id for r in seen.residencies] == ["x", "ext", "c"]
    assert seen.unmanaged_memory_mb == 100 + 300
    everything = fold(make_command(action_id="w2", kind="warm", host_id="h", model_id="m"), state=s)
    assert placed.without_uncommanded(snap, everything) == snap
