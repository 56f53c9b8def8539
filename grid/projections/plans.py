"""Plans projection: the latest recorded plan and the sequence a writer must expect next."""

from __future__ import annotations

import msgspec

from grid.events.base import Event
from grid.events.plan import PlanCreated
from grid.projections.position import Position


class PlansState(msgspec.Struct, frozen=True, kw_only=True):
    latest: PlanCreated | None = None
    latest_seq: int = 0
    latest_at: float | None = None
    count: int = 0


def initial() -> PlansState:
    return PlansState()


def apply(state: PlansState, event: Event, position: Position) -> PlansState:
    if isinstance(event, PlanCreated) and position.seq > state.latest_seq:
        return PlansState(latest=event, latest_seq=position.seq, latest_at=position.time, count=state.count + 1)
    return state
