"""What the controller placed and the hosts confirmed, for tests that drive a gateway by hand.

The gateway routes a managed residency only when the latest plan assigns its model to its host
and that host acknowledged a warm of it (grid.projections.placed). Tests that append heartbeats
themselves (no real controller, no real agent) append that corroboration through here:

    placements = Placements(log)
    await placements.corroborate("host-a", residencies)   # before the heartbeat claiming them
    await placements.place("host-a", "m")                  # the plan assigns it, the host acked a warm
    await placements.unplace("host-a", "m")                # a later plan no longer assigns it
    await placements.drained("host-a", "m")                # a succeeded drain ack

`plan_event` and `warm_ack` build the events alone, for pure folds.

An external residency (`managed=False`) is routed only when an operator admitted it
(grid.projections.routes): `route_admitted(host, residency)` builds that event, and
`Placements.admit(host, residencies)` appends it for every external ready one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import msgspec

from grid.events.acks import ActionAck
from grid.events.base import new_event_id
from grid.events.control import RouteAdmitted
from grid.events.host import Residency
from grid.events.log import EventLog
from grid.events.plan import PlanCreated, make_generation
from grid.fleet.planning import Placement, Plan, encode_plan
from grid.projections.routes import url_fingerprint

EPOCH = "test-epoch"


def plan_event(pairs: Iterable[tuple[str, str]], *, sequence: int = 1, at: float | None = None,
               unmanaged: Iterable[tuple[str, str]] = (), controller_term: int = 1,
               corroborated: Iterable[tuple[str, str]] | None = None) -> PlanCreated:
    """A recorded plan assigning each (host id, model id) of `pairs` (managed) and `unmanaged`;
    it lists `corroborated` (by default every managed pair) as warms the controller commanded
    and the host acknowledged."""
    now = time.time() if at is None else at
    pairs = sorted(pairs)
    placements = tuple(
        Placement(model_id=m, host_id=h, runtime="llama.cpp", memory_mb=300, status="existing", managed=managed)
        for managed, group in ((True, pairs), (False, unmanaged)) for h, m in sorted(group)
    )
    digest = f"{sequence:064x}"
    plan = Plan(planner_version="test", inputs_digest=digest, now=now, placements=placements)
    return PlanCreated(
        event_id=new_event_id(), at=now, planner_version="test", generation=make_generation(EPOCH, sequence, digest),
        epoch=EPOCH, sequence=sequence, inputs_digest=digest, based_on={}, now=now, controller_id="test-controller",
        controller_term=controller_term, plan=msgspec.Raw(encode_plan(plan)),
        corroborated=tuple(sorted(pairs if corroborated is None else corroborated)),
    )


def warm_ack(host_id: str, model_id: str, *, status: str = "succeeded", kind: str = "warm", message: str = "",
             action_id: str | None = None, at: float | None = None, generation: str = "") -> ActionAck:
    """A host's ack of a lifecycle command for `model_id` (by default: a succeeded warm)."""
    return ActionAck(
        event_id=new_event_id(), at=time.time() if at is None else at, host_id=host_id,
        action_id=action_id or f"{kind}-{host_id}-{model_id}", status=status, message=message,  # type: ignore[arg-type]
        kind=kind, model_id=model_id, generation=generation or make_generation(EPOCH, 1, "0" * 64),
        controller_term=1,
    )


def route_admitted(host_id: str, model_id: str, *, kind: str, endpoint: str,
                   at: float | None = None) -> RouteAdmitted:
    """The operator's admission of `host_id`'s external engine of `kind` at `endpoint` for `model_id`."""
    return RouteAdmitted(event_id=new_event_id(), at=time.time() if at is None else at, host_id=host_id,
                         model_id=model_id, kind=kind, url_fingerprint=url_fingerprint(endpoint))


class Placements:
    """Appends plans (each assigning every pair placed so far) and hosts' warm acks to a log.

    `ack_log(host_id)` names the log a host's acks are appended through (a signing log per host
    identity); by default the plan's log.
    """

    def __init__(self, log: EventLog, *, ack_log: Callable[[str], EventLog] | None = None) -> None:
        self.log = log
        self.ack_log = ack_log or (lambda _host: log)
        self.pairs: set[tuple[str, str]] = set()
        self.sequence = 0

    async def _plan(self) -> None:
        self.sequence += 1
        await self.log.append(plan_event(self.pairs, sequence=self.sequence))

    async def place(self, host_id: str, *model_ids: str, ack: bool = True) -> None:
        """The next plan assigns `model_ids` to `host_id`; the host acks their warms (unless not `ack`)."""
        self.pairs.update((host_id, m) for m in model_ids)
        await self._plan()
        if ack:
            for m in model_ids:
                await self.ack_log(host_id).append(warm_ack(host_id, m))

    async def unplace(self, host_id: str, model_id: str) -> None:
        self.pairs.discard((host_id, model_id))
        await self._plan()

    async def drained(self, host_id: str, model_id: str, kind: str = "drain") -> None:
        await self.ack_log(host_id).append(warm_ack(host_id, model_id, kind=kind))

    async def corroborate(self, host_id: str, residencies: Iterable[Residency]) -> None:
        """Place and ack every managed ready or warming residency of `residencies` not placed yet."""
        new = sorted({r.model_id for r in residencies
                      if r.managed and r.state in ("ready", "warming") and (host_id, r.model_id) not in self.pairs})
        if new:
            await self.place(host_id, *new)

    async def admit(self, host_id: str, residencies: Iterable[Residency]) -> None:
        """The operator admits every external residency of `residencies` that has an endpoint."""
        for r in residencies:
            if not r.managed and r.endpoint:
                await self.log.append(route_admitted(host_id, r.model_id, kind=r.runtime, endpoint=r.endpoint))
