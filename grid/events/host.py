"""Host events: registration, heartbeat (level-triggered actual state), protection transitions."""

from __future__ import annotations

from typing import Literal

from msgspec import UNSET, UnsetType

from grid.events.base import Event, Record

HostState = Literal["accepting", "throttled", "draining", "paused", "unhealthy", "quarantined"]
HOST_STATES: tuple[str, ...] = ("accepting", "throttled", "draining", "paused", "unhealthy", "quarantined")

ResidencyState = Literal["cached", "loading", "warming", "ready", "draining", "unloading", "failed"]
RESIDENCY_STATES: tuple[str, ...] = ("cached", "loading", "warming", "ready", "draining", "unloading", "failed")

# What this agent version can actuate. A host that does not list "evict" (an older agent) is
# never sent one: its predictive cache, if any, is left alone.
ACTUATOR_CAPABILITIES: tuple[str, ...] = ("load", "warm", "drain", "unload", "evict")


class AcceleratorDevice(Record, frozen=True, kw_only=True):
    """One accelerator as the agent read it (NVML/nvidia-smi, llama.cpp's device list, Apple)."""

    kind: str  # vendor family: "nvidia", "apple", ...
    index: int
    backend: str  # the compute backend engines use on it: "cuda", "metal", ...
    total_memory_mb: int
    # None: the reading has no free figure (Apple reports no per-GPU free memory).
    free_memory_mb: int | None = None
    name: str = ""
    # True when the device shares the host's RAM (Apple silicon): its memory is the RAM ledger.
    unified: bool = False


class RuntimeBuild(Record, frozen=True, kw_only=True):
    """A runtime this host can run and the backends its build can use."""

    runtime: str
    backends: tuple[str, ...] = ("cpu",)
    version: str = ""


class HostResources(Record, frozen=True, kw_only=True):
    capacity_mb: int
    reserved_mb: int = 0
    runtimes: tuple[str, ...] = ("llama.cpp",)
    backends: tuple[str, ...] = ()
    memory_bandwidth_gbps: float | None = None
    compute_gflops: float | None = None
    failure_domain: str = "default"
    tags: tuple[str, ...] = ()
    # Highest data tier this host may hold (see grid.events.control.DATA_TIERS).
    data_tier: str = "internal"
    gpu_count: int = 0
    gpu_memory_mb: int = 0
    cpu_count: int = 0
    # Fraction of capacity a throttled host offers for new placement.
    throttle_fraction: float = 0.5
    # Fraction of capacity usable after thermal derating (1.0 = none).
    thermal_derating: float = 1.0
    # Maximum number of serving models on this host; 0 means unlimited.
    model_limit: int = 0
    # Hardware detail. UNSET (left out of the encoding) on hosts that report none, so a
    # GPU-less host's events, planner inputs and plans keep their bytes.
    devices: tuple[AcceleratorDevice, ...] | UnsetType = UNSET
    unified_memory: bool | UnsetType = UNSET
    runtime_builds: tuple[RuntimeBuild, ...] | UnsetType = UNSET


class Residency(Record, frozen=True, kw_only=True):
    model_id: str
    memory_mb: int
    state: ResidencyState
    managed: bool = True
    runtime: str = "llama.cpp"
    artifact_sha256: str | None = None
    # Ages, not timestamps: the controller reconstructs times from receipt time so node clock
    # skew cannot bypass minimum residency or scale-down cooldown.
    loaded_age_seconds: float | None = None
    last_used_age_seconds: float | None = None
    active_requests: int = 0
    max_concurrency: int | None = None
    # Private loopback/LAN URL of the engine; the engine key is never carried in events.
    endpoint: str | None = None
    pinned: bool = False
    # Accelerator device indexes holding this engine's weights (UNSET: none, or not known).
    devices: tuple[int, ...] | UnsetType = UNSET


class CachedArtifact(Record, frozen=True, kw_only=True):
    model_id: str
    sha256: str
    size_bytes: int
    # Downloaded by a predictive prefetch (PREDICTIVE_PREFETCH) and never warmed since: the
    # only kind of cache entry an evict may remove.
    predictive: bool = False
    # Seconds since the artifact entered the cache (an age, not a timestamp: node clock skew
    # cannot age an entry into eviction). UNSET (left out of the encoding) from agents that do
    # not report it, so their heartbeats keep their bytes.
    cached_age_seconds: float | UnsetType = UNSET


class HostLoad(Record, frozen=True, kw_only=True):
    active_tasks: int = 0
    queue_depth: int = 0
    cpu_percent: float | None = None
    memory_used_mb: int | None = None


class HostUse(Record, frozen=True, kw_only=True):
    """Whose machine this is, as the agent runs it: the seed's `--dedicated` (an always-on
    server) or not (a workstation or laptop, an employee machine), and the protection policy's
    yield to its user."""

    # True: joined with an invitation made with `--dedicated`; False: joined without it; None:
    # not joined with an invitation (`gridctl up`'s own host, `node start --nats`), so nobody said.
    dedicated: bool | None = None
    # The host throttles while its user gave input within this many seconds (the policy's
    # `user_active_seconds`, `gridctl node start --yield-to-user`); None: it never yields.
    yield_to_user_seconds: float | None = None


class HostRegistered(Event, frozen=True, kw_only=True, tag="host.registered.v1"):
    host_id: str
    hostname: str = ""
    resources: HostResources
    actuator_capabilities: tuple[str, ...] = ACTUATOR_CAPABILITIES
    agent_version: str = ""
    schema_version: int = 1


class HostHeartbeat(Event, frozen=True, kw_only=True, tag="host.heartbeat.v1"):
    host_id: str
    state: HostState = "accepting"
    resources: HostResources
    residencies: tuple[Residency, ...] = ()
    cached: tuple[CachedArtifact, ...] = ()
    disk_free_bytes: int | None = None
    disk_total_bytes: int | None = None
    load: HostLoad = HostLoad()
    # Memory used by processes Grid does not manage (consumes capacity first).
    unmanaged_memory_mb: int = 0
    actuator_capabilities: tuple[str, ...] = ACTUATOR_CAPABILITIES
    # Highest controller term this agent has durably accepted (fencing visibility).
    highest_term: int = 0
    schema_version: int = 1
    # Bounded operator-visible warnings (e.g. a corrupt state file was quarantined at start).
    warnings: tuple[str, ...] = ()
    # Dedicated or employee machine and its yield to the user. UNSET (left out of the encoding)
    # when there is nothing to say (not joined by invitation and never yielding) and from older
    # agents, so their heartbeats keep their bytes.
    use: HostUse | UnsetType = UNSET


class ProtectionTransition(Event, frozen=True, kw_only=True, tag="host.protection.v1"):
    host_id: str
    from_state: HostState
    to_state: HostState
    reason: str
    override: bool = False
    # Bounded sensor readings that justified the transition; None means unknown, never zero.
    sensors: dict[str, float | None] = {}


QualificationResult = Literal["passed", "failed"]
QUALIFICATION_PASSED = "passed"
QUALIFICATION_FAILED = "failed"


class QualificationStep(Record, frozen=True, kw_only=True):
    """One step of a runtime qualification: its name, verdict, duration and reason constant."""

    name: str
    ok: bool
    seconds: float = 0.0
    reason: str = ""


class QualificationRecorded(Event, frozen=True, kw_only=True, tag="host.qualification.v1"):
    """Durable evidence that a runtime ran its real lifecycle for a model on this host.

    Written by the host itself (its own credential, on its own subject): a host can only ever
    vouch for itself. Carries names, digests and reason constants only, never a prompt or a
    response; `endpoint` is set for an external engine (no credentials in it)."""

    host_id: str
    runtime: str
    model_id: str
    artifact_sha256: str | None = None
    result: QualificationResult
    # The first step that failed and its reason constant (None/"" when the qualification passed).
    failed_step: str | None = None
    reason: str = ""
    steps: tuple[QualificationStep, ...] = ()
    endpoint: str | None = None


def devices_of(res: HostResources) -> tuple[AcceleratorDevice, ...]:
    return () if res.devices is UNSET else res.devices  # type: ignore[return-value]


def runtime_builds_of(res: HostResources) -> tuple[RuntimeBuild, ...]:
    return () if res.runtime_builds is UNSET else res.runtime_builds  # type: ignore[return-value]


def residency_devices(r: object) -> tuple[int, ...]:
    d = getattr(r, "devices", UNSET)
    return () if d is UNSET else d  # type: ignore[return-value]
