"""REASON constants: every expected planner outcome is a value carrying one of these names.

Constant names are UPPER_CASE; their values are lower snake_case, the one case every reason in
Grid uses (reconciler, gateway, agent and OpenAI error codes alike).

Feasibility reasons (why a host cannot take a model), shortfall reasons (why a model is not
fully placed), placement reasons (why a replica is in the desired set) and preemption reasons.
They belong to the fleet vocabulary, not to the planner, because a recorded plan carries them
to every reader: the reconciler, the router, status and the dashboard.
"""

from __future__ import annotations

# --- host lifecycle (checked once per host) ----------------------------------------------
HEARTBEAT_MISSING = "heartbeat_missing"  # registered but never heard from
HOST_NOT_ELIGIBLE_STATE = (
    "host_not_eligible_state"  # paused, draining, unhealthy, quarantined
)
HEARTBEAT_STALE = (
    "heartbeat_stale"  # now - heartbeat_at > policy.heartbeat_timeout_seconds
)
HEARTBEAT_FUTURE = "heartbeat_future"  # heartbeat_at > now + policy.future_skew_seconds

# --- operator placement policy (per host, per model) --------------------------------------
DENIED = "denied"  # host in profile.deny_hosts
NOT_ALLOWED = "not_allowed"  # profile.allow_hosts set and host not in it
PIN_MISMATCH = "pin_mismatch"  # profile.pins set and host not in it
# profile.require_qualified and the host has no passing qualification for it
NOT_QUALIFIED = "not_qualified"

# --- compatibility (per host class, per model) ---------------------------------------------
DATA_TIER = "data_tier"
RUNTIME_MISMATCH = "runtime_mismatch"
BACKEND_MISMATCH = "backend_mismatch"
MISSING_REQUIRED_TAG = "missing_required_tag"
FORBIDDEN_TAG = "forbidden_tag"
GPU_COUNT = "gpu_count"
GPU_MEMORY = "gpu_memory"

# --- capacity (static: never fits; dynamic: does not fit now) ------------------------------
INSUFFICIENT_MEMORY = "insufficient_memory"
INSUFFICIENT_DISK = "insufficient_disk"
MODEL_LIMIT = "model_limit"
COLOCATION_LIMIT = "colocation_limit"
COLOCATION_EXCLUDED = "colocation_excluded"
# The model already has (or is draining/unloading/reserving) a residency on this host.
ALREADY_PRESENT = "already_present"
FAILURE_DOMAIN = "failure_domain"
UNKNOWN_HOST = "unknown_host"  # a pin names a host with no snapshot
# The host or the model flaps (grid.fleet.quarantine): no new placement until the backoff ends;
# incumbents stay. Also a shortfall reason.
FLAP_QUARANTINE = "flap_quarantine"

FEASIBILITY_REASONS: tuple[str, ...] = (
    HEARTBEAT_MISSING,
    HOST_NOT_ELIGIBLE_STATE,
    HEARTBEAT_STALE,
    HEARTBEAT_FUTURE,
    DENIED,
    NOT_ALLOWED,
    PIN_MISMATCH,
    NOT_QUALIFIED,
    DATA_TIER,
    RUNTIME_MISMATCH,
    BACKEND_MISMATCH,
    MISSING_REQUIRED_TAG,
    FORBIDDEN_TAG,
    GPU_COUNT,
    GPU_MEMORY,
    INSUFFICIENT_MEMORY,
    INSUFFICIENT_DISK,
    MODEL_LIMIT,
    COLOCATION_LIMIT,
    COLOCATION_EXCLUDED,
    ALREADY_PRESENT,
    FAILURE_DOMAIN,
    UNKNOWN_HOST,
    FLAP_QUARANTINE,
)

# --- shortfall reasons (a model has fewer compliant replicas than wanted) --------------------
NO_ELIGIBLE_HOST = "no_eligible_host"  # no host passes the static checks
PREEMPTION_STAGED = (
    "preemption_staged"  # victims drain first; placed after memory is proven free
)
AWAITING_RELEASE = (
    "awaiting_release"  # capacity is held by obsolete residencies already leaving
)
RELOCATION_STAGED = (
    "relocation_staged"  # another model's incumbent moves off the host first (make-before-break)
)
EVICTION_BUDGET = "eviction_budget"  # policy.max_evictions reached for this plan
PIN_UNSATISFIED = "pin_unsatisfied"  # a hard pin cannot be placed on its exact host
RETAINED_NONCOMPLIANT = (
    "retained_noncompliant"  # old replica kept (make-before-break) with no replacement
)
PLACEMENT_BUDGET = "placement_budget"  # policy.max_new_placements reached for this plan
NOT_PLACED = (
    "not_placed"  # eligible capacity exists now but the replica's turn had none
)

SHORTFALL_REASONS: tuple[str, ...] = (
    NO_ELIGIBLE_HOST,
    PREEMPTION_STAGED,
    AWAITING_RELEASE,
    RELOCATION_STAGED,
    EVICTION_BUDGET,
    PIN_UNSATISFIED,
    RETAINED_NONCOMPLIANT,
    PLACEMENT_BUDGET,
    NOT_PLACED,
    # plus any dynamic feasibility reason (INSUFFICIENT_MEMORY, MODEL_LIMIT, FAILURE_DOMAIN, ...)
)

# --- placement reasons ------------------------------------------------------------------------
INCUMBENT = (
    "incumbent"  # healthy live managed residency that still satisfies every constraint
)
EXTERNAL_RESIDENCY = (
    "external_residency"  # unmanaged residency that satisfies demand (never actuated)
)
PINNED_RESIDENCY = "pinned_residency"  # operator-pinned residency (never actuated)
RETAINED_UNTIL_REPLACED = (
    "retained_until_replaced"  # must move; kept until replacements are ready
)
PIN = "pin"  # new replica on a profile's pinned host
BASELINE = "baseline"  # new replica for min_replicas
DIRECT = "direct"  # new replica for direct request/queue/SLO evidence
INFERRED = "inferred"  # new replica for correlation-only (predictive) evidence
REPAIRED = "repaired"  # moved by bounded backtracking repair
RELOCATED = "relocated"  # an incumbent's new copy, moved to make room for another model

# --- preemption reasons -----------------------------------------------------------------------
PRIORITY_PREEMPTION = "priority_preemption"
RELOCATION = "relocation"  # an incumbent whose replacement is ready drains to make room
MODEL_LIMIT_CONVERGENCE = (
    "model_limit_convergence"  # host model ceiling lowered below live inventory
)
COLOCATION_CONVERGENCE = (
    "colocation_convergence"  # tightened co-location policy already violated
)

# --- predictive cache reasons (grid.planner.prefetch) -------------------------------------
# A cache-only advisory: fetch and verify a correlation-only prediction's artifact, never warm.
PREDICTIVE_PREFETCH = "predictive_prefetch"
# An unused predictive cache entry past the predictive cache TTL whose demand has gone.
PREDICTIVE_CACHE_EXPIRED = "predictive_cache_expired"
