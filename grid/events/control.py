"""Operator control events: model profiles, mode, host overrides, tick requests and the forecast window."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from msgspec import Meta

from grid.events.base import Event, Record

Mode = Literal["observe", "recommend", "automatic"]
MODES: tuple[str, ...] = ("observe", "recommend", "automatic")
DEFAULT_MODE: Mode = "recommend"

# Ordered from least to most sensitive; a host may hold data up to its own tier.
DATA_TIERS: tuple[str, ...] = ("public", "internal", "confidential", "restricted")

OverrideState = Literal["draining", "paused", "quarantined"]

# --- what a profile may hold -----------------------------------------------------------------
# One grammar for model ids, enforced by the admin API, by gridctl before it sends, and by the
# event decoder (a ProfileSet outside it is malformed, skipped and counted by the folds): 1-128
# characters, letters, digits and . _ : + -, starting with a letter or a digit. So no '/', no
# '..' path segment, no whitespace or control character: an id is one path segment of the admin
# API and a safe file name. (The lookahead keeps Python's '$' from accepting a final newline.)
MODEL_ID_MAX_LENGTH = 128
MODEL_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,127}(?!\n)$"
MODEL_ID_GRAMMAR = ("1-128 characters: letters, digits and . _ : + -, starting with a letter or a digit "
                    "(no '/', whitespace or control characters)")
_MODEL_ID_RE = re.compile(MODEL_ID_PATTERN)

# Numbers are bounded by what any machine (or fleet) can have, so an absurd value is refused at
# the API and malformed on the log instead of reaching the planner's arithmetic.
MAX_MEMORY_MB = 16 * 1024 * 1024     # 16 TiB, in MiB: memory, per-runtime memory, artifact size, GPU memory
MAX_REPLICAS = 4096                  # min_replicas, max_replicas, min_failure_domains
MAX_SLOTS = 1024                     # replica_concurrency: parallel requests one replica serves
MAX_CONTEXT_TOKENS = 2 ** 24         # context_size: 16M tokens (beyond every model's window today)
MAX_GPUS = 256                       # min_gpu_count
MAX_MODELS_PER_HOST = 4096           # max_colocated_models (0: unlimited)
MAX_PRIORITY = 1_000_000             # |priority|
MAX_SECONDS = 7 * 86400              # load/warm/residency/cooldown/service seconds: a week
MAX_LATENCY_MS = MAX_SECONDS * 1000.0


def model_id_error(model_id: str) -> str | None:
    """Why `model_id` is not a valid model id, or None."""
    if isinstance(model_id, str) and _MODEL_ID_RE.match(model_id):
        return None
    return f"model id must be {MODEL_ID_GRAMMAR}; got {model_id!r}"


def profile_values_error(values: dict[str, object]) -> str | None:
    """Why profile field `values` (a partial profile, JSON-shaped) break a type or a bound, or
    None: the event decoder's own check, for a client to run before it sends."""
    import msgspec

    try:
        msgspec.convert({"model_id": "m", "memory_mb": 1, **values}, ModelProfile)
    except msgspec.ValidationError as exc:
        return str(exc)
    return None


ModelId = Annotated[str, Meta(pattern=MODEL_ID_PATTERN, max_length=MODEL_ID_MAX_LENGTH)]
MemoryMb = Annotated[int, Meta(ge=0, le=MAX_MEMORY_MB)]
Replicas = Annotated[int, Meta(ge=0, le=MAX_REPLICAS)]
Seconds = Annotated[float, Meta(ge=0.0, le=MAX_SECONDS)]


class ModelProfile(Record, frozen=True, kw_only=True):
    model_id: ModelId
    # Resident runtime budget for one replica (not the file size).
    memory_mb: MemoryMb
    runtime_memory_mb: dict[str, MemoryMb] = {}
    runtimes: tuple[str, ...] = ("llama.cpp",)
    backends: tuple[str, ...] = ()
    artifact_sha256: str | None = None
    artifact_source: str | None = None
    artifact_size_mb: MemoryMb | None = None
    min_replicas: Replicas = 0
    max_replicas: Replicas = 1
    priority: Annotated[int, Meta(ge=-MAX_PRIORITY, le=MAX_PRIORITY)] = 0
    data_tier: str = "internal"
    required_tags: tuple[str, ...] = ()
    forbidden_tags: tuple[str, ...] = ()
    allow_hosts: tuple[str, ...] = ()
    deny_hosts: tuple[str, ...] = ()
    pins: tuple[str, ...] = ()
    min_failure_domains: Replicas = 1
    max_colocated_models: Annotated[int, Meta(ge=0, le=MAX_MODELS_PER_HOST)] = 0
    colocation_excludes: tuple[str, ...] = ()
    workload_scores: dict[str, Annotated[float, Meta(ge=0.0, le=1.0)]] = {}
    target_utilization: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.7
    expected_service_seconds: Seconds = 2.0
    latency_slo_ms: Annotated[float, Meta(ge=0.0, le=MAX_LATENCY_MS)] | None = None
    replica_concurrency: Annotated[int, Meta(ge=0, le=MAX_SLOTS)] = 1
    load_seconds: Seconds = 30.0
    warm_seconds: Seconds = 15.0
    min_residency_seconds: Seconds = 300.0
    scale_down_cooldown_seconds: Seconds = 600.0
    min_gpu_count: Annotated[int, Meta(ge=0, le=MAX_GPUS)] = 0
    min_gpu_memory_mb: MemoryMb = 0
    context_size: Annotated[int, Meta(ge=0, le=MAX_CONTEXT_TOKENS)] = 2048
    # The engine also serves /v1/embeddings (started with --embeddings); the gateway routes
    # embeddings requests only to such models.
    embeddings: bool = False
    # Place only on hosts whose latest qualification of the runtime for this model (and its
    # artifact digest, when set) passed (grid.fleet.qualification).
    require_qualified: bool = False


class ProfileSet(Event, frozen=True, kw_only=True, tag="control.profile_set.v1"):
    profile: ModelProfile


class ProfileRemoved(Event, frozen=True, kw_only=True, tag="control.profile_removed.v1"):
    model_id: ModelId


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


# --- external routes: operator facts ------------------------------------------------------------
# An engine Grid did not start is routed only when an operator (or the controller) admitted it by
# a signed event on the control stream naming the host, the model, the engine's kind and a
# fingerprint of its endpoint (grid.projections.routes.url_fingerprint: sha256 hex of the
# normalised base URL; never the URL's key, which is in no event). A host may ask for it (`gridctl
# engine add` prints the operator's command), never grant it: hosts may not write `grid.ctl.>`.
ROUTE_KIND_MAX_LENGTH = 64
UrlFingerprint = Annotated[str, Meta(pattern=r"^[0-9a-f]{64}$")]
HostId = Annotated[str, Meta(min_length=1, max_length=256)]
RouteKind = Annotated[str, Meta(min_length=1, max_length=ROUTE_KIND_MAX_LENGTH)]


class RouteAdmitted(Event, frozen=True, kw_only=True, tag="control.route_admitted.v1"):
    """The operator admits host `host_id`'s external engine of `kind` at the endpoint whose
    fingerprint is `url_fingerprint` as a route for `model_id` (until a RouteWithdrawn)."""

    host_id: HostId
    model_id: ModelId
    kind: RouteKind
    url_fingerprint: UrlFingerprint
    reason: str = ""


class RouteWithdrawn(Event, frozen=True, kw_only=True, tag="control.route_withdrawn.v1"):
    """The admission of host `host_id`'s external route for `model_id` is withdrawn."""

    host_id: HostId
    model_id: ModelId
    reason: str = ""


class TickRequested(Event, frozen=True, kw_only=True, tag="control.tick_requested.v1"):
    reason: str = ""


# The demand projection's default bucket: the forecast counts its windows in buckets (evidence
# gate 15, trend 6, retained history 60), so by default they are minutes.
DEFAULT_FORECAST_BUCKET_SECONDS = 60.0
MIN_FORECAST_BUCKET_SECONDS = 1.0
MAX_FORECAST_BUCKET_SECONDS = 3600.0
BucketSeconds = Annotated[float, Meta(ge=MIN_FORECAST_BUCKET_SECONDS, le=MAX_FORECAST_BUCKET_SECONDS)]


class ForecastWindowSet(Event, frozen=True, kw_only=True, tag="control.forecast_window_set.v1"):
    """The length of one demand bucket from this point of the log on. Every forecast window is a
    count of buckets, so a shorter bucket compresses them all alike (15 buckets of 4 s: an
    evidence gate of one minute), which lets a test workday run in minutes. On the log rather
    than in a process's settings so that replay folds the same buckets the live controller did."""

    bucket_seconds: BucketSeconds = DEFAULT_FORECAST_BUCKET_SECONDS
