from __future__ import annotations

import math

from grid.events.acks import ActionAck
from grid.events.codec import encode_value
from grid.events.commands import CommandIssued, CommandWithdrawn
from grid.events.control import HostOverride, ModelProfile, ModeSet, ProfileRemoved, ProfileSet
from grid.events.host import HostHeartbeat, HostResources, Residency
from grid.projections import actions, catalog, fleet
from grid.projections.position import Position
from tests.heartbeats import heartbeat

RES = HostResources(capacity_mb=8000)


def pos(seq: int, t: float = 1000.0, stream: str = "S") -> Position:
    return Position(stream, seq, t)


def cmd(action_id: str = "a1", kind: str = "warm") -> CommandIssued:
    return CommandIssued(
        event_id=action_id, at=0, action_id=action_id, kind=kind, host_id="h", model_id="m", memory_mb=100,
        generation="e:1:d", controller_term=1, controller_id="c", lease_expires_at=0, lease_ttl_seconds=15,
    )


def ack(status: str, action_id: str = "a1", duration: float | None = 2.0, eid: str | None = None) -> ActionAck:
    return ActionAck(event_id=eid or f"{action_id}-{status}", at=0, host_id="h", action_id=action_id, status=status,
                     duration_seconds=duration)


def test_duplicate_and_conflicting_later_acks_are_harmless() -> None:
    s = actions.apply(actions.initial(), cmd(), pos(1))
    s = actions.apply(s, ack("accepted"), pos(2))
    s = actions.apply(s, ack("succeeded"), pos(3))
    once = s
    s = actions.apply(s, ack("succeeded", eid="dup"), pos(4))
    s = actions.apply(s, ack("failed"), pos(5))
    assert s.actions["a1"].status == "succeeded"
    assert s.actions["a1"] == once.actions["a1"]


def test_late_ack_completes_a_withdrawn_action() -> None:
    s = actions.apply(actions.initial(), cmd(), pos(1))
    s = actions.apply(s, CommandWithdrawn(event_id="w", at=0, action_id="a1", host_id="h", reason="left_automatic"), pos(2))
    assert s.actions["a1"].withdrawn and s.actions["a1"].terminal_at is None
    s = actions.apply(s, ack("succeeded"), pos(3))
    assert s.actions["a1"].status == "succeeded"


def test_ack_before_its_command_is_applied_when_the_command_arrives() -> None:
    s = actions.apply(actions.initial(), ack("succeeded"), pos(1, stream="GRID_HOSTS"))
    assert "a1" not in s.actions
    s = actions.apply(s, cmd(), pos(1, stream="GRID_CMDS"))
    assert s.actions["a1"].status == "succeeded" and not s.early_acks


def test_warm_timings_learn_an_ewma_and_ignore_invalid_reports() -> None:
    s = actions.initial()
    for i, duration in enumerate([10.0, 10.0, math.inf, -1.0, 7200.0, 4.0]):
        aid = f"a{i}"
        s = actions.apply(s, cmd(aid), pos(2 * i + 1))
        s = actions.apply(s, ack("succeeded", aid, duration), pos(2 * i + 2))
    [timing] = s.timings.values()
    assert timing.kind == "warm" and timing.samples == 3
    assert 4.0 < timing.ewma_seconds < 10.0


def test_history_is_bounded() -> None:
    s = actions.initial()
    for i in range(actions.MAX_TERMINAL_ACTIONS + 10):
        s = actions.apply(s, cmd(f"a{i}"), pos(2 * i + 1))
        s = actions.apply(s, ack("failed", f"a{i}"), pos(2 * i + 2))
    assert len(s.actions) == actions.MAX_TERMINAL_ACTIONS
    assert "a0" not in s.actions


def hb(host: str, state: str = "accepting", *residencies: Residency) -> HostHeartbeat:
    return heartbeat(host, *residencies, event_id=f"{host}-{state}", at=0, state=state, resources=RES)


def test_an_older_heartbeat_never_overwrites_a_newer_one() -> None:
    s = fleet.apply(fleet.initial(), hb("h", "paused"), pos(5, 100.0))
    s = fleet.apply(s, hb("h", "accepting"), pos(3, 90.0))
    assert s.hosts["h"].heartbeat.state == "paused" and s.hosts["h"].heartbeat_at == 100.0


def test_snapshot_turns_residency_ages_into_receipt_times() -> None:
    r = Residency(model_id="m", memory_mb=10, state="ready", loaded_age_seconds=30.0, last_used_age_seconds=5.0)
    s = fleet.apply(fleet.initial(), hb("h", "accepting", r), pos(1, 1000.0))
    [snap] = fleet.snapshots(s, now=1001.0)
    assert snap.residencies[0].loaded_at == 970.0 and snap.residencies[0].last_used_at == 995.0
    assert snap.heartbeat_at == 1000.0


def test_override_tightens_but_never_relaxes_and_expires() -> None:
    s = fleet.apply(fleet.initial(), hb("h", "accepting"), pos(1))
    s = fleet.apply(s, HostOverride(event_id="o", at=0, host_id="h", state="draining", expires_at=2000.0), pos(2))
    assert fleet.effective_state(s.hosts["h"], now=1500.0) == "draining"
    assert fleet.effective_state(s.hosts["h"], now=2500.0) == "accepting"
    s = fleet.apply(s, hb("h", "unhealthy"), pos(3))
    assert fleet.effective_state(s.hosts["h"], now=1500.0) == "unhealthy"  # local safety wins


def test_catalog_mode_defaults_to_recommend_and_tombstones_persist_until_recreated() -> None:
    s = catalog.initial()
    assert s.mode == "recommend"
    p = ModelProfile(model_id="m.gguf", memory_mb=100)
    s = catalog.apply(s, ProfileSet(event_id="1", at=0, profile=p), pos(1))
    s = catalog.apply(s, ProfileRemoved(event_id="2", at=0, model_id="m.gguf"), pos(2, 50.0))
    assert "m.gguf" not in s.profiles and s.retired["m.gguf"].last_profile == p
    assert catalog.configured_models(s) == frozenset()
    s = catalog.apply(s, ModeSet(event_id="3", at=0, mode="automatic"), pos(3))
    s = catalog.apply(s, ProfileSet(event_id="4", at=0, profile=p), pos(4))
    assert s.mode == "automatic" and "m.gguf" in s.profiles and not s.retired
    assert s.revisions["m.gguf"] == 4


def test_folds_never_mutate_their_input() -> None:
    s0 = fleet.apply(fleet.initial(), hb("a"), pos(1))
    before = encode_value(s0)  # the project's encoder: it writes a SharedMap as its dict
    fleet.apply(s0, hb("b"), pos(2))
    assert encode_value(s0) == before
