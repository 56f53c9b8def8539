"""Operator control events: model profiles, mode, host overrides and tick requests."""

from __future__ import annotations

from typing import Literal

from grid.events.base import Event, Record

Mode = Literal["observe", "recommend", "automatic"]
MODES: tuple[str, ...] = ("observe", "recommend", "automatic")
DEFAULT_MODE: Mode = "recommend"

# Ordered from least to most sensitive; a host may hold data up to its own tier.
DATA_TIERS: tuple[str, ...] = ("public", "internal", "confidential", "restricted")

OverrideState = Literal["draining", "paused", "quarantined"]


class ModelProfile(Record, frozen=True, kw_only=True):
    model_id: str
    # Resident runtime budget for one replica (not the file size).
    memory_mb: int
    runtime_memory_mb: dict[str, int] = {}
    runtimes: tuple[str, ...] = ("llama.cpp",)
    backends: tuple[str, ...] = ()
    artifact_sha256: str | None = None
    artifact_source: str | None = None
    artifact_size_mb: int | None = None
    min_replicas: int = 0
    max_replicas: int = 1
    priority: int = 0
    data_tier: str = "internal"
    required_tags: tuple[str, ...] = ()
    forbidden_tags: tuple[str, ...] = ()
    allow_hosts: tuple[str, ...] = ()
    deny_hosts: tuple[str, ...] = ()
    pins: tuple[str, ...] = ()
    min_failure_domains: int = 1
    max_colocated_models: int = 0
    colocation_excludes: tuple[str, ...] = ()
    workload_scores: dict[str, float] = {}
    target_utilization: float = 0.7
    expected_service_seconds: float = 2.0
    latency_slo_ms: float | None = None
    replica_concurrency: int = 1
    load_seconds: float = 30.0
    warm_seconds: float = 15.0
    min_residency_seconds: float = 300.0
    scale_down_cooldown_seconds: float = 600.0
    min_gpu_count: int = 0
    min_gpu_memory_mb: int = 0
    context_size: int = 2048
    # The engine also serves /v1/embeddings (started with --embeddings); the gateway routes
    # embeddings requests only to such models.
    embeddings: bool = False


class ProfileSet(Event, frozen=True, kw_only=True, tag="control.profile_set.v1"):
    profile: ModelProfile


class ProfileRemoved(Event, frozen=True, kw_only=True, tag="control.profile_removed.v1"):
    model_id: str


class ModeSet(Event, frozen=True, kw_only=True, tag="control.mode_set.v1"):
    mode: Mode


class HostOverride(Event, frozen=True, kw_only=True, tag="control.host_override.v1"):
    host_id: str
    # None releases the override (resume).
    state: OverrideState | None
    reason: str = ""
    expires_at: float | None = None


class CredentialRevoked(Event, frozen=True, kw_only=True, tag="control.credential_revoked.v1"):
    """Every key `host_id` held is revoked from this point of the log on: folds reject messages
    those keys sign after it (replay then judges a window exactly as the live folds did)."""

    host_id: str
    # The user public keys (nkeys) revoked.
    keys: tuple[str, ...]
    reason: str = ""


class TickRequested(Event, frozen=True, kw_only=True, tag="control.tick_requested.v1"):
    reason: str = ""
