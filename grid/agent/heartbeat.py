"""The agent's level-triggered report, built purely from what the agent observed.

`build_heartbeat` reads no clock, process table or disk: the agent samples those (activity
from /slots, RSS of its children, memory in use, the artifact cache, disk usage) and passes the
readings in, so one set of readings always yields the same event.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from msgspec import UNSET, UnsetType

from grid.agent.artifacts import IndexEntry
from grid.agent.context import endpoint
from grid.agent.engines import llama_cpp
from grid.agent.inventory import Inventory
from grid.agent.options import AgentOptions
from grid.agent.state import ResidencyRecord
from grid.events.host import (
    ACTUATOR_CAPABILITIES,
    CachedArtifact,
    HostHeartbeat,
    HostLoad,
    HostResources,
    HostUse,
    Residency,
)
from grid.fleet import HOLDS_MEMORY_STATES, SERVING_STATES

def host_resources(options: AgentOptions, *, capacity_mb: int, has_runtime: bool, cpu_count: int,
                   inventory: Inventory | None = None) -> HostResources:
    """What the host offers: its capacity share and operator labels, and (from the detected
    inventory, when given) its runtimes, backends, GPUs and CPUs."""
    if inventory is None:
        return HostResources(
            capacity_mb=capacity_mb, reserved_mb=options.reserved_mb,
            runtimes=(llama_cpp.RUNTIME,) if has_runtime else (), backends=("cpu",),
            failure_domain=options.failure_domain, tags=tuple(options.tags), data_tier=options.data_tier,
            cpu_count=cpu_count, throttle_fraction=options.policy.throttle_fraction,
        )
    return HostResources(
        capacity_mb=capacity_mb,
        reserved_mb=options.reserved_mb,
        runtimes=inventory.runtimes,
        backends=inventory.backends,
        failure_domain=options.failure_domain,
        tags=tuple(options.tags),
        data_tier=options.data_tier,
        gpu_count=len(inventory.gpus),
        gpu_memory_mb=inventory.gpu_memory_mb,
        cpu_count=inventory.cpu_count,
        throttle_fraction=options.policy.throttle_fraction,
        memory_bandwidth_gbps=inventory.memory_bandwidth_gbps,
        compute_gflops=inventory.compute_gflops,
        # Left out (UNSET) when there is nothing to say, so GPU-less hosts keep their bytes.
        devices=inventory.devices or UNSET,
        unified_memory=True if inventory.unified_memory else UNSET,
        runtime_builds=inventory.runtime_builds or UNSET,
    )


def host_use(options: AgentOptions) -> HostUse | UnsetType:
    """Dedicated or employee machine and its yield to the user, for the heartbeat; UNSET when
    there is nothing to say (not joined by invitation and never yielding)."""
    yield_seconds = options.policy.user_active_seconds
    if options.dedicated is None and yield_seconds is None:
        return UNSET
    return HostUse(dedicated=options.dedicated, yield_to_user_seconds=yield_seconds)


def residency_report(rec: ResidencyRecord, active: int | None, now: float) -> Residency:
    routed = rec.state in SERVING_STATES
    return Residency(
        model_id=rec.model_id,
        memory_mb=rec.memory_mb if rec.state in HOLDS_MEMORY_STATES else 0,
        state=rec.state,  # type: ignore[arg-type]
        managed=True,
        runtime=llama_cpp.RUNTIME,
        artifact_sha256=rec.artifact_sha256,
        loaded_age_seconds=None if rec.loaded_at is None or not routed else max(0.0, now - rec.loaded_at),
        last_used_age_seconds=None if rec.last_used_at is None else max(0.0, now - rec.last_used_at),
        active_requests=active or 0,
        max_concurrency=rec.slots if routed else None,
        endpoint=endpoint(rec) if routed else None,
        devices=rec.devices if rec.devices and rec.state in HOLDS_MEMORY_STATES else UNSET,
    )


def cached_reports(entries: Sequence[IndexEntry], now: float) -> tuple[CachedArtifact, ...]:
    """The cache as the heartbeat reports it: each artifact's provenance, and its age on the
    agent's clock (clamped at zero, so a clock stepped back never reports a negative age; left
    out when the entry does not say when it was added)."""
    return tuple(
        CachedArtifact(
            model_id=e.model_id, sha256=e.sha256, size_bytes=e.size_bytes, predictive=e.predictive,
            cached_age_seconds=max(0.0, now - e.added_at) if e.added_at > 0 else UNSET,
        )
        for e in entries
    )


# A host clock further than this from the log server's (learned from our own appends' receipt
# times) signs heartbeats with the server's time instead: the folds reject a heartbeat whose
# signed time lies more than grid.events.authorship.SIGNED_TIME_SKEW_SECONDS (10 s) from its
# receipt, so a borrowed machine with a wrong clock would otherwise vanish from the grid.
CLOCK_OFF_SECONDS = 2.0
# The smallest step between two heartbeats' signed times (the folds take only a newer one).
SIGNED_TIME_STEP_SECONDS = 0.001


def signed_time(now: float, server_now: float | None, last_signed: float | None) -> float:
    """The time to sign a heartbeat with: this host's clock, or the server's estimated time when
    the two differ by more than CLOCK_OFF_SECONDS; always after the last one signed (a clock
    stepped back must not make the next heartbeat look like a replay of an older one)."""
    at = now if server_now is None or abs(now - server_now) <= CLOCK_OFF_SECONDS else server_now
    if last_signed is not None and at <= last_signed:
        at = last_signed + SIGNED_TIME_STEP_SECONDS
    return at


def build_heartbeat(
    *,
    event_id: str,
    now: float,
    host_id: str,
    protection_state: str,
    resources: HostResources,
    residencies: Mapping[str, ResidencyRecord],
    activity: Mapping[str, int | None],
    managed_rss_mb: int,
    memory_used_mb: int,
    cached: Sequence[CachedArtifact],
    disk_free_bytes: int | None,
    disk_total_bytes: int | None,
    cpu_percent: float | None,
    highest_term: int,
    warnings: Sequence[str],
    external: Sequence[Residency] = (),
    use: HostUse | UnsetType = UNSET,
) -> HostHeartbeat:
    """One heartbeat. `activity` maps model id -> requests in flight (None: unknown);
    `managed_rss_mb` is the summed RSS of Grid-owned children, so unmanaged memory is the rest.

    `external` are the residencies of engines Grid does not own (grid.agent.external), reported
    with `managed=False` after Grid's own. Their declared memory is use outside Grid: it is
    carried on their residencies (so status and the planner see whose it is) and taken out of
    the unmanaged figure, so the planner, which charges both, counts it once and never less
    than was measured."""
    reports = tuple(
        residency_report(residencies[model_id], activity.get(model_id), now) for model_id in sorted(residencies)
    ) + tuple(external)
    external_mb = sum(r.memory_mb for r in external if r.state in SERVING_STATES)
    active_total = sum(a for a in activity.values() if a)
    return HostHeartbeat(
        event_id=event_id,
        at=now,
        host_id=host_id,
        state=protection_state,  # type: ignore[arg-type]
        resources=resources,
        residencies=reports,
        cached=tuple(cached),
        disk_free_bytes=disk_free_bytes,
        disk_total_bytes=disk_total_bytes,
        load=HostLoad(
            active_tasks=active_total,
            queue_depth=0,
            cpu_percent=cpu_percent,
            memory_used_mb=memory_used_mb,
        ),
        unmanaged_memory_mb=max(0, memory_used_mb - managed_rss_mb - external_mb),
        actuator_capabilities=ACTUATOR_CAPABILITIES,
        highest_term=highest_term,
        warnings=tuple(warnings),
        use=use,
    )
