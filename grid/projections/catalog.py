"""Catalog projection: model profiles, the mode (default recommend), retirement tombstones and
the operator's admitted external routes (grid.projections.routes folds those)."""

from __future__ import annotations

import msgspec

from grid.events.base import Event
from grid.events.control import (
    DEFAULT_MODE,
    ModelProfile,
    ModeSet,
    ProfileRemoved,
    ProfileSet,
    RouteAdmitted,
    RouteWithdrawn,
    TickRequested,
)
from grid.projections import routes as routes_proj
from grid.projections.position import Position


class Tombstone(msgspec.Struct, frozen=True):
    model_id: str
    retired_at: float
    # The profile as it was, so managed copies that reappear later can still be drained.
    last_profile: ModelProfile | None = None


class CatalogState(msgspec.Struct, frozen=True, kw_only=True):
    profiles: dict[str, ModelProfile] = {}
    # Sequence of the latest profile event per model: the revision shown in status.
    revisions: dict[str, int] = {}
    retired: dict[str, Tombstone] = {}
    mode: str = DEFAULT_MODE
    mode_changed_at: float | None = None
    tick_requests: int = 0
    last_tick_request_at: float | None = None
    # External routes an operator admitted (signed RouteAdmitted / RouteWithdrawn on GRID_CTL).
    routes: routes_proj.RoutesState = routes_proj.RoutesState()


def initial() -> CatalogState:
    return CatalogState()


def apply(state: CatalogState, event: Event, position: Position) -> CatalogState:
    match event:
        case ProfileSet():
            model_id = event.profile.model_id
            profiles = dict(state.profiles)
            profiles[model_id] = event.profile
            retired = state.retired
            if model_id in retired:
                # Re-creating the profile is the only thing that clears a tombstone.
                retired = {k: v for k, v in retired.items() if k != model_id}
            return msgspec.structs.replace(
                state, profiles=profiles, retired=retired, revisions={**state.revisions, model_id: position.seq}
            )
        case ProfileRemoved():
            model_id = event.model_id
            profiles = {k: v for k, v in state.profiles.items() if k != model_id}
            tombstone = Tombstone(model_id, position.time, state.profiles.get(model_id))
            return msgspec.structs.replace(
                state,
                profiles=profiles,
                retired={**state.retired, model_id: tombstone},
                revisions={**state.revisions, model_id: position.seq},
            )
        case ModeSet():
            return msgspec.structs.replace(state, mode=event.mode, mode_changed_at=position.time)
        case TickRequested():
            return msgspec.structs.replace(
                state, tick_requests=state.tick_requests + 1, last_tick_request_at=position.time
            )
        case RouteAdmitted() | RouteWithdrawn():
            return msgspec.structs.replace(state, routes=routes_proj.apply(state.routes, event, position))
    return state


def configured_models(state: CatalogState) -> frozenset[str]:
    """Model ids that may create demand series: configured and not retiring."""
    return frozenset(state.profiles)


def sorted_profiles(state: CatalogState) -> tuple[ModelProfile, ...]:
    return tuple(state.profiles[k] for k in sorted(state.profiles))
