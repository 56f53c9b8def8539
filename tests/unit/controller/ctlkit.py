"""Builders for controller tests: hosts, residencies, profiles, plans and action history."""

from __future__ import annotations

from collections.abc import Iterable

from grid.controller.issue import Issuer, command_issued
from grid.controller.reconcile import Action, ReconcileResult, reconcile
from grid.events.acks import ActionAck
from grid.events.commands import CommandIssued, CommandWithdrawn
from grid.events.control import ModelProfile
from grid.events.host import ACTUATOR_CAPABILITIES, CachedArtifact, HostResources
from grid.events.subjects import COMMANDS_STREAM, HOSTS_STREAM
from grid.fleet.planning import Placement, Plan, PlannerInput, Preemption, Shortfall
from grid.fleet.views import HostView, ResidencyView
from grid.projections import actions as actions_proj
from grid.projections.actions import ActionsState
from grid.projections.position import Position

NOW = 1_800_000_000.0
SHA_A = "a" * 64
SHA_B = "b" * 64


def res(model: str, state: str = "ready", *, managed: bool = True, pinned: bool = False, memory: int = 1000,
        loaded_age: float | None = 100_000.0, used_age: float | None = 100_000.0, active: int = 0,
        sha: str | None = None, now: float = NOW) -> ResidencyView:
    return ResidencyView(
        model_id=model, memory_mb=memory, state=state, managed=managed, pinned=pinned, artifact_sha256=sha,
        loaded_at=None if loaded_age is None else now - loaded_age,
        last_used_at=None if used_age is None else now - used_age, active_requests=active,
    )


def host(host_id: str, *residencies: ResidencyView, state: str = "accepting", capacity: int = 16_000,
         hb_at: float | None = NOW - 1.0, cached: Iterable[tuple[str, str]] = (),
         caps: tuple[str, ...] = ACTUATOR_CAPABILITIES, domain: str = "d1", unmanaged_mb: int = 0) -> HostView:
    return HostView(
        host_id=host_id, state=state,
        resources=HostResources(capacity_mb=capacity, failure_domain=domain),
        residencies=tuple(sorted(residencies, key=lambda r: (r.model_id, r.state))),
        cached=tuple(CachedArtifact(model_id=m, sha256=s, size_bytes=1) for m, s in cached),
        actuator_capabilities=caps, heartbeat_at=hb_at, unmanaged_memory_mb=unmanaged_mb,
    )


def profile(model: str, **kw) -> ModelProfile:
    kw.setdefault("memory_mb", 1000)
    kw.setdefault("min_residency_seconds", 0.0)
    kw.setdefault("scale_down_cooldown_seconds", 0.0)
    return ModelProfile(model_id=model, **kw)


def profiles(*ps: ModelProfile) -> dict[str, ModelProfile]:
    return {p.model_id: p for p in ps}


def placement(model: str, host_id: str, *, status: str = "new", memory: int = 1000) -> Placement:
    return Placement(model_id=model, host_id=host_id, runtime="llama.cpp", memory_mb=memory, status=status)  # type: ignore[arg-type]


def mkplan(*placements: Placement, preemptions: Iterable[Preemption] = (),
           shortfalls: Iterable[Shortfall] = (), now: float = NOW) -> Plan:
    return Plan(planner_version="test", inputs_digest="0" * 64, now=now, placements=tuple(placements),
                preemptions=tuple(preemptions), shortfalls=tuple(shortfalls))


def command_for(a: Action, *, at: float = NOW, generation: str = "e:00000000000000000001:d",
                term: int = 1) -> CommandIssued:
    return command_issued(a, Issuer(controller_id="c", controller_term=term, generation=generation),
                          issued_at=at, lease_remaining=15.0)


class History:
    """Folds commands, withdrawals and acks through the real actions projection."""

    def __init__(self) -> None:
        self.state: ActionsState = actions_proj.initial()
        self.cmd_seq = 0
        self.host_seq = 0

    def issue(self, *acts: Action, at: float = NOW) -> "History":
        for a in acts:
            self.cmd_seq += 1
            self.state = actions_proj.apply(self.state, command_for(a, at=at), Position(COMMANDS_STREAM, self.cmd_seq, at))
        return self

    def withdraw(self, a: Action, *, at: float = NOW) -> "History":
        self.cmd_seq += 1
        ev = CommandWithdrawn(event_id=f"w-{a.action_id}-{self.cmd_seq}", at=at, action_id=a.action_id,
                              host_id=a.host_id, reason="test")
        self.state = actions_proj.apply(self.state, ev, Position(COMMANDS_STREAM, self.cmd_seq, at))
        return self

    def ack(self, a: Action, status: str = "succeeded", *, at: float = NOW, duration: float | None = 1.0) -> "History":
        self.host_seq += 1
        ev = ActionAck(event_id=f"ack-{a.action_id}-{self.host_seq}", at=at, host_id=a.host_id,
                       action_id=a.action_id, status=status, duration_seconds=duration, kind=a.kind,  # type: ignore[arg-type]
                       model_id=a.model_id)
        self.state = actions_proj.apply(self.state, ev, Position(HOSTS_STREAM, self.host_seq, at))
        return self


def observed(hosts: Iterable[HostView], profs: dict[str, ModelProfile], *, retired: Iterable[str] = (),
             now: float = NOW) -> PlannerInput:
    """What a reconciler is shown: hosts, profiles and retired models, as the tick builds it."""
    return PlannerInput(now=now, profiles=tuple(profs[m] for m in sorted(profs)), hosts=tuple(hosts),
                        retired=tuple(sorted(retired)))


def reconcile_hosts(plan: Plan, hosts: Iterable[HostView], history: ActionsState, profs: dict[str, ModelProfile],
                    now: float = NOW, *, retired: Iterable[str] = (), **kw) -> ReconcileResult:  # type: ignore[no-untyped-def]
    """`reconcile` over a host list and a profile map (the table tests' shape)."""
    return reconcile(plan, observed(hosts, profs, retired=retired, now=now), history, now, **kw)


def kinds(result) -> list[tuple[str, str, str]]:  # type: ignore[no-untyped-def]
    return [(a.kind, a.host_id, a.model_id) for a in result.actions]


def reasons(result) -> dict[tuple[str, str, str], str]:  # type: ignore[no-untyped-def]
    return {(d.kind, d.host_id, d.model_id): d.reason for d in result.deferred}
