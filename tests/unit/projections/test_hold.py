"""Holding projection states for a tick on a worker thread: what is held does not move while the
runner goes on folding, including the projections whose fold mutates its state in place."""

from __future__ import annotations

from grid.controller.tick import PROJECTIONS, compose_tick
from grid.events.acks import ActionAck
from grid.events.codec import encode_value
from grid.events.commands import CommandIssued
from grid.events.control import ModelProfile, ProfileSet
from grid.events.host import Residency
from grid.events.requests import RequestBatch, RequestFeatures
from grid.events.subjects import COMMANDS_STREAM, CONTROL_STREAM, HOSTS_STREAM, REQUESTS_STREAM
from grid.fleet.planning import Policy
from grid.projections.position import Position
from grid.projections.runner import ProjectionRunner, copy_state
from tests.heartbeats import heartbeat

T0 = 1_800_000_000.0
MODELS = ("model-a.gguf", "model-b.gguf")


def requests(n: int, host: str = "host-0") -> RequestBatch:
    records = tuple(
        RequestFeatures(endpoint="chat", requested_model=MODELS[i % 2], served_model=MODELS[i % 2], host_id=host,
                        output_units=50 + i, service_seconds=0.5 + i / 100, queue_seconds=0.01, finished_at=T0)
        for i in range(n))
    return RequestBatch(event_id=f"rb-{n}-{host}", at=T0, source="gw", records=records)


class Script:
    """Folds events straight into a runner, each at the next position of its stream."""

    def __init__(self, runner: ProjectionRunner) -> None:
        self.runner = runner
        self.seq: dict[str, int] = {}
        self.t = T0

    def fold(self, stream: str, event: object) -> None:
        self.seq[stream] = self.seq.get(stream, 0) + 1
        self.t += 0.5
        self.runner.fold_event(event, Position(stream, self.seq[stream], self.t))  # type: ignore[arg-type]


def busy_runner() -> tuple[ProjectionRunner, Script]:
    runner = ProjectionRunner(PROJECTIONS)
    s = Script(runner)
    for m in MODELS:
        s.fold(CONTROL_STREAM, ProfileSet(event_id=f"p-{m}", at=T0, profile=ModelProfile(model_id=m, memory_mb=1000)))
    for i in range(4):
        s.fold(HOSTS_STREAM, heartbeat(f"host-{i}", Residency(model_id=MODELS[i % 2], memory_mb=1000, state="ready"),
                                       at=T0, event_id=f"hb-{i}"))
    s.fold(COMMANDS_STREAM, CommandIssued(
        event_id="a-1", at=T0, action_id="a-1", kind="warm", host_id="host-0", model_id=MODELS[0], memory_mb=1000,
        generation="e:1:d", controller_term=1, controller_id="c", lease_expires_at=T0 + 15, lease_ttl_seconds=15))
    for k in range(6):
        s.fold(REQUESTS_STREAM, requests(10 + k))
    return runner, s


def encoded(states: dict[str, object]) -> dict[str, bytes]:
    return {name: encode_value(state) for name, state in states.items()}


def test_held_states_do_not_move_while_the_runner_folds_on() -> None:
    runner, s = busy_runner()
    held = runner.hold()
    before = encoded(dict(held.states))
    positions = dict(held.positions)
    assert before == encoded(runner.states) and positions == runner.positions
    # What a tick's fold-time neighbours bring: requests (demand and throughput fold in place),
    # heartbeats (a new host, a changed one), an ack.
    for k in range(5):
        s.fold(REQUESTS_STREAM, requests(7, host=f"host-{k % 4}"))
    s.fold(HOSTS_STREAM, heartbeat("host-9", at=T0 + 5, event_id="hb-9"))
    s.fold(HOSTS_STREAM, heartbeat("host-0", at=T0 + 5, event_id="hb-0b"))
    s.fold(HOSTS_STREAM, ActionAck(event_id="ack-1", at=T0, host_id="host-0", action_id="a-1", status="accepted"))
    after = encoded(runner.states)
    assert encoded(dict(held.states)) == before
    assert dict(held.positions) == positions != runner.positions
    # The fold really changed every projection the tick reads from these streams, in place ones too.
    for name in ("fleet", "actions", "demand", "throughput", "lifecycle"):
        assert after[name] != before[name], name


def test_an_in_place_state_is_copied_exactly_and_the_others_are_held_as_they_are() -> None:
    runner, _ = busy_runner()
    held = runner.hold()
    for spec in runner.specs:
        if spec.in_place:
            assert held.states[spec.name] is not runner.states[spec.name]
            assert held.states[spec.name] == runner.states[spec.name]
        else:
            assert held.states[spec.name] is runner.states[spec.name]
    assert {s.name for s in runner.specs if s.in_place} == {"demand", "throughput"}
    demand = runner.states["demand"]
    assert encode_value(copy_state(demand)) == encode_value(demand)


def test_a_tick_on_held_states_plans_what_it_would_have_planned_at_that_instant() -> None:
    """Same input bytes, same plan bytes: the held copy changes nothing the planner sees."""
    runner, s = busy_runner()
    now = s.t + 1.0
    direct = compose_tick(runner.states, now, Policy())
    held = runner.hold()
    for k in range(3):
        s.fold(REQUESTS_STREAM, requests(20, host=f"host-{k}"))
    s.fold(HOSTS_STREAM, heartbeat("host-7", at=now, event_id="hb-7"))
    from_held = compose_tick(held.states, now, Policy())
    assert encode_value(from_held.planner_input) == encode_value(direct.planner_input)
    assert encode_value(from_held.plan) == encode_value(direct.plan)
    moved_on = compose_tick(runner.states, now, Policy())
    assert encode_value(moved_on.planner_input) != encode_value(direct.planner_input)
