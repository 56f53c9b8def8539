"""One strategy over one scenario, minute by minute, through the production pipeline.

Each minute at simulated time T:
1. incidents change machine state (outage, throttle, recovery);
2. every live machine heartbeats; the heartbeats and everything that happened since the last
   tick (acks, request telemetry) are folded, in receipt-time order, by the real projections;
3. the production tick (grid.controller.tick.run_tick) plans with the strategy's input and
   planner (smart is the controller's own) and reconciles (automatic mode, default limits);
   the actions are checked against the safety invariants and issued to the machines through
   grid.controller.issue;
4. the minute's requests are routed with the gateway's own choice (grid.gateway.routing:
   build_table, auto_model, choose) against what the gateway would see; device time beyond a
   replica's concurrency is refused, the outcome becomes request telemetry;
5. the machines run their commands until T+60 with modelled timings.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from grid.controller.governor import Limits
from grid.controller.issue import Issuer, command_issued, command_withdrawn
from grid.controller.reconcile import Guards, ReconcileResult
from grid.controller.tick import PROJECTIONS, Controls, run_tick
from grid.events.base import Event
from grid.events.control import ModeSet, ProfileSet
from grid.events.plan import make_generation
from grid.events.requests import MAX_BATCH_RECORDS, RequestBatch, RequestFeatures
from grid.events.subjects import COMMANDS_STREAM, CONTROL_STREAM, HOSTS_STREAM, REQUESTS_STREAM
from grid.fleet.planning import Plan, PlannerInput, Policy
from grid.gateway import routing
from grid.projections import fleet as fleet_proj
from grid.projections.position import Position
from grid.projections.runner import STREAM_ORDER, ProjectionRunner
from grid.sim import safety, strategies
from grid.sim.metrics import Metrics
from grid.sim.scenario import EPOCH, Scenario
from grid.sim.traffic import AUTO, Request
from grid.sim.world import World

# Sees every tick's planner input, plan and reconcile result (tests and diagnosis).
TickObserver = Callable[[int, PlannerInput, Plan, ReconcileResult], None]

TICK_SECONDS = 60.0
# A throttled machine runs slower as well as taking a smaller share (thermal derating).
THROTTLED_SPEED = 0.6
# A request meets its SLO when it finishes within this multiple of its speed-1.0 cost.
SLO_FACTOR = 2.0
# Direct demand a drain must not strand: requests for the model within this window.
DEMAND_WINDOW_MINUTES = 10
CONTROLLER_ID = "sim"
# The lab controller's epoch in command generations (grid.events.plan.make_generation).
GENERATION_EPOCH = "sim"
# The lease time left every lab command carries (the lab's controller never loses its lease).
LEASE_SECONDS = 30.0
_RANK = {s: i for i, s in enumerate(STREAM_ORDER)}


@dataclass(slots=True)
class _Log:
    """Events waiting for their receipt time, folded in (time, stream order, emission) order."""

    runner: ProjectionRunner
    # Sees every event as it is folded (tests: what the log would hold).
    on_event: Callable[[str, Event], None] | None = None
    heap: list[tuple[float, int, int, str, Event]] = field(default_factory=list)
    seqs: dict[str, int] = field(default_factory=dict)
    n: int = 0

    def emit(self, at: float, stream: str, event: Event) -> None:
        self.n += 1
        heapq.heappush(self.heap, (at, _RANK[stream], self.n, stream, event))

    def flush(self, until: float) -> None:
        while self.heap and self.heap[0][0] <= until:
            at, _, _, stream, event = heapq.heappop(self.heap)
            seq = self.seqs.get(stream, 0) + 1
            self.seqs[stream] = seq
            if self.on_event is not None:
                self.on_event(stream, event)
            self.runner.fold_event(event, Position(stream, seq, at))


def run(sc: Scenario, strategy: str, *, timeline: bool = False, on_tick: TickObserver | None = None,
        on_event: Callable[[str, Event], None] | None = None, policy: Policy | None = None) -> Metrics:
    """`policy`: the planner policy (default: the controller's); the lab's comparisons vary it."""
    policy = Policy() if policy is None else policy
    limits = Limits()
    runner = ProjectionRunner(PROJECTIONS)
    log = _Log(runner, on_event)
    world = World(sc.fleet, sc.profiles, EPOCH)
    metrics = Metrics(sc, strategy, timeline=timeline)
    specs = {m.host_id: m for m in sc.fleet}
    for i, model_id in enumerate(sorted(sc.profiles)):
        log.emit(EPOCH - 1.0, CONTROL_STREAM, ProfileSet(event_id=f"profile-{i}", at=EPOCH - 1.0,
                                                         profile=strategies.lab_profile(strategy, sc.profiles[model_id])))
    log.emit(EPOCH - 1.0, CONTROL_STREAM, ModeSet(event_id="mode", at=EPOCH - 1.0, mode="automatic"))
    prepare, planner = strategies.tick_functions(
        strategy, sc.profiles, sc.fleet, sc.average_targets() if strategy == strategies.STATIC else ())
    controls = Controls(policy=policy, mode="automatic", limits=limits, guards=Guards())
    incident: dict[str, str | None] = {h: None for h in specs}
    last_demand: dict[str, int] = {}
    for minute in range(sc.day.minutes):
        now = EPOCH + minute * TICK_SECONDS
        for host_id in sorted(specs):
            kind = sc.day.incident_state(host_id, minute)
            if kind != incident[host_id]:
                world.set_incident(host_id, kind, now, log.emit)
                metrics.incident(minute, host_id, kind)
                incident[host_id] = kind
        for host_id in sorted(specs):
            hb = world.heartbeat(host_id, now)
            if hb is not None:
                log.emit(now, HOSTS_STREAM, hb)
        log.flush(now)
        states = runner.states

        # --- the production tick: observe, forecast, plan, reconcile --------------------------
        tick = run_tick(states, now, controls, planner=planner, prepare=prepare)
        pin, plan, result = tick.planner_input, tick.plan, tick.result
        demanded = frozenset(m for m, last in last_demand.items() if minute - last <= DEMAND_WINDOW_MINUTES)
        for violation in safety.check_tick(plan, pin.hosts, result, states["actions"], sc.profiles, demanded,
                                           now, limits, guards=controls.guards):
            metrics.violation(minute, *violation)
        # The lab is one controller (term 1) whose plan sequence is the tick number.
        issuer = Issuer(controller_id=CONTROLLER_ID, controller_term=1,
                        generation=make_generation(GENERATION_EPOCH, minute + 1, plan.inputs_digest))
        for w in result.withdrawals:
            log.emit(now, COMMANDS_STREAM, command_withdrawn(w, issuer, at=now))
            world.withdraw(w.host_id, w.action_id)
        for a in result.actions:
            cmd = command_issued(a, issuer, issued_at=now, lease_remaining=LEASE_SECONDS)
            log.emit(now, COMMANDS_STREAM, cmd)
            world.deliver(cmd)
            metrics.action(minute, a.kind, a.host_id, a.model_id, a.reason, a.preemption_for)
        log.flush(now)
        metrics.plan(minute, plan)
        if on_tick is not None:
            on_tick(minute, pin, plan, result)

        # --- route the minute's requests -----------------------------------------------------
        snaps = fleet_proj.snapshots(runner.states["fleet"], now)
        records = route(sc, snaps, sc.requests[minute], now, world, metrics, specs, minute)
        for r in sc.requests[minute]:
            if r.model != AUTO:
                last_demand[r.model] = minute
        for i in range(0, len(records), MAX_BATCH_RECORDS):
            log.emit(now + TICK_SECONDS - 0.5, REQUESTS_STREAM, RequestBatch(
                event_id=f"req-{minute}-{i}", at=now + TICK_SECONDS - 0.5, source="sim-gateway",
                records=tuple(records[i:i + MAX_BATCH_RECORDS])))
        metrics.residency(minute, world)

        # --- the machines work until the next tick ------------------------------------------
        world.advance(now + TICK_SECONDS, log.emit)
        log.flush(now + TICK_SECONDS - 1e-6)
    metrics.finish(world)
    return metrics


def route(sc: Scenario, snaps, requests: tuple[Request, ...], now: float, world: World, metrics: Metrics,
          specs, minute: int) -> list[RequestFeatures]:
    """Route each request with the production choice; refuse what exceeds replica concurrency."""
    table = routing.build_table(snaps)
    ready = routing.ready_models(table, now)
    states = {s.host_id: s.state for s in snaps}
    used: dict[routing.RouteKey, float] = {}
    records: list[RequestFeatures] = []
    auto_choice: dict[str, str | None] = {}
    for r in requests:
        if r.model == AUTO:
            if r.workload not in auto_choice:
                auto_choice[r.workload] = routing.auto_model(r.workload, sc.profiles, ready)
            model = auto_choice[r.workload]
        else:
            model = r.model
        decision = None
        route_ = None
        if model is not None:
            candidates = table.get(model, ())
            active = {k: int(v // TICK_SECONDS) for k, v in used.items()}
            # The proxy's in-flight count: a replica whose minute cannot take this request's
            # device time is full (bounded: each retry closes one candidate).
            for _ in range(len(candidates) + 1):
                decision = routing.choose(candidates, now=now, proxy_active=active)
                route_ = decision.route
                if route_ is None:
                    break
                conc = routing.effective_concurrency(route_) or 1
                if used.get(route_.key, 0.0) + r.service_seconds / _speed(specs, route_) <= conc * TICK_SECONDS:
                    break
                active[route_.key] = conc
                route_ = None
        finished = now + r.offset
        if route_ is None:
            reason = routing.REASON_NO_READY if decision is None else (decision.reason if decision.route is None
                                                                        else routing.REASON_AT_CAPACITY)
            metrics.request(minute, r, None, reason, 0.0, False)
            records.append(RequestFeatures(
                endpoint=r.endpoint, requested_model=r.model, served_model=None, modality=r.modality,
                input_units=r.input_units, workload=r.workload, outcome="unavailable", status_code=503,
                finished_at=finished, auto=r.model == AUTO, affinity=r.affinity))
            continue
        if route_.state != "ready" or states.get(route_.host_id) not in ("accepting", "throttled"):
            metrics.violation(minute, safety.ROUTING, f"{route_.model_id} on {route_.host_id} ({route_.state})")
        per_request = r.service_seconds / _speed(specs, route_)
        conc = routing.effective_concurrency(route_) or 1
        load = min(1.0, used.get(route_.key, 0.0) / TICK_SECONDS / conc)
        latency = per_request * (1.0 + load)
        used[route_.key] = used.get(route_.key, 0.0) + per_request
        world.touch(route_.host_id, route_.model_id, finished)
        ok = latency <= SLO_FACTOR * r.service_seconds
        metrics.request(minute, r, route_.model_id, routing.ROUTED, per_request, ok)
        records.append(RequestFeatures(
            endpoint=r.endpoint, requested_model=r.model, served_model=route_.model_id, host_id=route_.host_id,
            modality=r.modality, input_units=r.input_units, workload=r.workload,
            service_seconds=round(per_request, 6), queue_seconds=round(latency - per_request, 6),
            queue_depth=int(math.floor(load * conc)), finished_at=finished + latency, auto=r.model == AUTO,
            affinity=r.affinity, artifact_sha256=route_.artifact_sha256))
    return records


def _speed(specs, route_: routing.RouteCandidate) -> float:
    spec = specs[route_.host_id]
    return spec.speed * (THROTTLED_SPEED if route_.host_state == "throttled" else 1.0)
