"""Hosts and residencies as the controller sees them: the host view every layer above reads.

A HostView is one host's last heartbeat combined with its registration, local protection
and operator overrides, ages turned into receipt-clock timestamps. The planner places on it,
the reconciler acts on it, the router and `gridctl status` read it.
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET, UnsetType

from grid.events.host import CachedArtifact, HostLoad, HostResources
from grid.fleet.devices import vram_capacity_mb


class Value(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """Base for the fleet and planner values: frozen, deterministic to encode."""


class ResidencyView(Value, frozen=True, kw_only=True):
    """A residency as the controller sees it: ages turned into receipt-clock timestamps."""

    model_id: str
    memory_mb: int
    state: str  # cached | loading | warming | ready | draining | unloading | failed
    managed: bool = True
    runtime: str = "llama.cpp"
    artifact_sha256: str | None = None
    loaded_at: float | None = None
    last_used_at: float | None = None
    active_requests: int = 0
    max_concurrency: int | None = None
    pinned: bool = False
    endpoint: str | None = None
    # Accelerator device indexes holding the weights (UNSET: none or not known; left out of
    # the encoding so inputs without devices keep their bytes).
    devices: tuple[int, ...] | UnsetType = UNSET


class QualificationView(Value, frozen=True, kw_only=True):
    """A host's latest runtime qualification for one (runtime, model), as the log recorded it
    (grid.events.host.QualificationRecorded); `recorded_at` is its receipt time."""

    runtime: str
    model_id: str
    artifact_sha256: str | None = None
    passed: bool
    failed_step: str | None = None
    reason: str = ""
    recorded_at: float


class HostView(Value, frozen=True, kw_only=True):
    host_id: str
    # Lifecycle state after local protection and operator overrides are combined.
    state: str
    resources: HostResources
    residencies: tuple[ResidencyView, ...] = ()
    cached: tuple[CachedArtifact, ...] = ()
    disk_free_bytes: int | None = None
    disk_total_bytes: int | None = None
    load: HostLoad = HostLoad()
    unmanaged_memory_mb: int = 0
    actuator_capabilities: tuple[str, ...] = ()
    # Receipt time (log clock) of the last heartbeat; None = registered but never heard from.
    heartbeat_at: float | None = None
    # Measured performance (proxy-owned), keyed by model id: tokens/s and latency seconds.
    measured_tokens_per_second: dict[str, float] = {}
    # The latest qualification per (runtime, model), sorted by (runtime, model_id).
    qualifications: tuple[QualificationView, ...] = ()


def raw_allocatable_mb(res: HostResources) -> int:
    """(capacity - reserved) * thermal derating, never negative. On a host whose placements
    live in discrete GPU memory (grid.fleet.devices) the capacity is that memory (the RAM
    reserve does not apply to it)."""
    derating = min(1.0, max(0.0, float(res.thermal_derating)))
    vram = vram_capacity_mb(res)
    if vram:
        return max(0, int(vram * derating))
    return max(0, int((res.capacity_mb - res.reserved_mb) * derating))
