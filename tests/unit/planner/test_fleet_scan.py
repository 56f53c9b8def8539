"""The fleet feasibility scan applies placement's immutable checks, not lifecycle or occupancy."""

from __future__ import annotations

from grid.events.control import ModelProfile
from grid.events.host import HostResources
from grid.fleet.views import HostView, ResidencyView
from grid.planner.fleet_scan import placeable_models


def _host(host_id: str, mb: int, **kw) -> HostView:  # type: ignore[no-untyped-def]
    state = kw.pop("state", "accepting")
    return HostView(host_id=host_id, state=state, resources=HostResources(capacity_mb=mb, **kw), heartbeat_at=None)


def test_only_models_some_host_could_ever_hold() -> None:
    hosts = (
        _host("a", 16_000, runtimes=("llama.cpp", "comfyui"), backends=("metal",)),
        # stale, paused and full of other work: still counts (a temporary state must not flip the map)
        HostView(host_id="b", state="paused", resources=HostResources(capacity_mb=24_000, reserved_mb=2_000),
                     residencies=(ResidencyView(model_id="x", memory_mb=20_000, state="ready"),)),
    )
    profiles = [
        ModelProfile(model_id="fits", memory_mb=8_000),
        ModelProfile(model_id="big", memory_mb=23_000),  # 24 GB host minus 2 GB reserve
        ModelProfile(model_id="exact", memory_mb=22_000),
        ModelProfile(model_id="cuda", memory_mb=1_000, runtimes=("comfyui",), backends=("cuda",)),
        ModelProfile(model_id="secret", memory_mb=1_000, data_tier="restricted"),
        ModelProfile(model_id="denied", memory_mb=1_000, deny_hosts=("a", "b")),
        ModelProfile(model_id="pinned", memory_mb=20_000, pins=("a",)),
        ModelProfile(model_id="img", memory_mb=4_000, runtimes=("comfyui",)),
    ]
    assert placeable_models(profiles, hosts) == frozenset({"fits", "exact", "img"})
    assert placeable_models(profiles, ()) == frozenset()
