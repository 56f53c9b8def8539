"""Small builders for planner inputs (real values, no mocks)."""

from __future__ import annotations

from grid.events.control import ModelProfile
from grid.events.host import CachedArtifact, HostLoad, HostResources
from grid.fleet.planning import DemandTarget, Harm, Plan, PlannerInput, Policy
from grid.fleet.views import HostView, ResidencyView

NOW = 100_000.0
GB = 1 << 30


def host(
    hid: str,
    cap: int = 16_000,
    *,
    state: str = "accepting",
    domain: str = "d0",
    tags: tuple[str, ...] = (),
    runtimes: tuple[str, ...] = ("llama.cpp",),
    backends: tuple[str, ...] = (),
    tier: str = "internal",
    limit: int = 0,
    residencies: tuple[ResidencyView, ...] = (),
    cached: tuple[CachedArtifact, ...] = (),
    disk_free: int | None = 100 * GB,
    hb: float | None = NOW - 1.0,
    unmanaged: int = 0,
    reserved: int = 0,
    throttle: float = 0.5,
    derating: float = 1.0,
    gpus: int = 0,
    gpu_mem: int = 0,
    bw: float | None = None,
    gflops: float | None = None,
    tps: dict[str, float] | None = None,
    queue: int = 0,
    active: int = 0,
) -> HostView:
    return HostView(
        host_id=hid,
        state=state,
        resources=HostResources(
            capacity_mb=cap,
            reserved_mb=reserved,
            runtimes=runtimes,
            backends=backends,
            memory_bandwidth_gbps=bw,
            compute_gflops=gflops,
            failure_domain=domain,
            tags=tags,
            data_tier=tier,
            gpu_count=gpus,
            gpu_memory_mb=gpu_mem,
            throttle_fraction=throttle,
            thermal_derating=derating,
            model_limit=limit,
        ),
        residencies=residencies,
        cached=cached,
        disk_free_bytes=disk_free,
        disk_total_bytes=None if disk_free is None else 2 * disk_free,
        load=HostLoad(active_tasks=active, queue_depth=queue),
        unmanaged_memory_mb=unmanaged,
        heartbeat_at=hb,
        measured_tokens_per_second=tps or {},
    )


def prof(mid: str, mem: int = 4_000, **kw) -> ModelProfile:
    kw.setdefault("min_replicas", 1)
    kw.setdefault("max_replicas", max(kw["min_replicas"], 1))
    return ModelProfile(model_id=mid, memory_mb=mem, **kw)


def res(
    mid: str,
    mem: int = 4_000,
    state: str = "ready",
    *,
    loaded_at: float | None = NOW - 10_000,
    **kw,
) -> ResidencyView:
    return ResidencyView(
        model_id=mid, memory_mb=mem, state=state, loaded_at=loaded_at, **kw
    )


def want(
    mid: str,
    n: int,
    evidence: str = "direct",
    *,
    offered_concurrency: float = 0.0,
    **harm: float,
) -> DemandTarget:
    return DemandTarget(
        model_id=mid,
        replicas=n,
        evidence=evidence,
        harm=Harm(**harm),
        offered_concurrency=offered_concurrency,
    )


def mk(
    profiles, hosts, demand=(), *, policy: Policy | None = None, **kw
) -> PlannerInput:
    return PlannerInput(
        now=NOW,
        profiles=tuple(profiles),
        hosts=tuple(hosts),
        demand=tuple(demand),
        policy=policy or Policy(),
        **kw,
    )


def on(plan: Plan, model: str, status: str | None = None) -> list[str]:
    return sorted(
        p.host_id
        for p in plan.placements
        if p.model_id == model and (status is None or p.status == status)
    )


def count(plan: Plan, model: str) -> int:
    return sum(1 for p in plan.placements if p.model_id == model)


def shortfall_reasons(plan: Plan, model: str) -> set[str]:
    return {s.reason for s in plan.shortfalls if s.model_id == model}


def explanation(plan: Plan, model: str):
    return next(e for e in plan.explanations if e.model_id == model)
