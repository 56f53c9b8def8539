"""REASON constants: every expected planner outcome is a value carrying one of these names.

Feasibility reasons (why a host cannot take a model), shortfall reasons (why a model is not
fully placed), placement reasons (why a replica is in the desired set) and preemption reasons.
"""

from __future__ import annotations

# --- host lifecycle (checked once per host) ----------------------------------------------
HEARTBEAT_MISSING = "HEARTBEAT_MISSING"  # registered but never heard from
HOST_NOT_ELIGIBLE_STATE = (
    "HOST_NOT_ELIGIBLE_STATE"  # paused, draining, unhealthy, quarantined
)
HEARTBEAT_STALE = (
    "HEARTBEAT_STALE"  # now - heartbeat_at > policy.heartbeat_timeout_seconds
)
HEARTBEAT_FUTURE = "HEARTBEAT_FUTURE"  # heartbeat_at > now + policy.future_skew_seconds

# --- operator placement policy (per host, per model) --------------------------------------
DENIED = "DENIED"  # host in profile.deny_hosts
NOT_ALLOWED = "NOT_ALLOWED"  # profile.allow_hosts set and host not in it
PIN_MISMATCH = "PIN_MISMATCH"  # profile.pins set and host not in it

# --- compatibility (per host class, per model) ---------------------------------------------
DATA_TIER = "DATA_TIER"
RUNTIME_MISMATCH = "RUNTIME_MISMATCH"
BACKEND_MISMATCH = "BACKEND_MISMATCH"
MISSING_REQUIRED_TAG = "MISSING_REQUIRED_TAG"
FORBIDDEN_TAG = "FORBIDDEN_TAG"
GPU_COUNT = "GPU_COUNT"
GPU_MEMORY = "GPU_MEMORY"

# --- capacity (static: never fits; dynamic: does not fit now) ------------------------------
INSUFFICIENT_MEMORY = "INSUFFICIENT_MEMORY"
INSUFFICIENT_DISK = "INSUFFICIENT_DISK"
MODEL_LIMIT = "MODEL_LIMIT"
COLOCATION_LIMIT = "COLOCATION_LIMIT"
COLOCATION_EXCLUDED = "COLOCATION_EXCLUDED"
# The model already has (or is draining/unloading/reserving) a residency on this host.
ALREADY_PRESENT = "ALREADY_PRESENT"
FAILURE_DOMAIN = "FAILURE_DOMAIN"
UNKNOWN_HOST = "UNKNOWN_HOST"  # a pin names a host with no snapshot

FEASIBILITY_REASONS: tuple[str, ...] = (
    HEARTBEAT_MISSING,
    HOST_NOT_ELIGIBLE_STATE,
    HEARTBEAT_STALE,
    HEARTBEAT_FUTURE,
    DENIED,
    NOT_ALLOWED,
    PIN_MISMATCH,
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
)

# --- shortfall reasons (a model has fewer compliant replicas than wanted) --------------------
NO_ELIGIBLE_HOST = "NO_ELIGIBLE_HOST"  # no host passes the static checks
PREEMPTION_STAGED = (
    "PREEMPTION_STAGED"  # victims drain first; placed after memory is proven free
)
AWAITING_RELEASE = (
    "AWAITING_RELEASE"  # capacity is held by obsolete residencies already leaving
)
EVICTION_BUDGET = "EVICTION_BUDGET"  # policy.max_evictions reached for this plan
PIN_UNSATISFIED = "PIN_UNSATISFIED"  # a hard pin cannot be placed on its exact host
RETAINED_NONCOMPLIANT = (
    "RETAINED_NONCOMPLIANT"  # old replica kept (make-before-break) with no replacement
)
PLACEMENT_BUDGET = "PLACEMENT_BUDGET"  # policy.max_new_placements reached for this plan
NOT_PLACED = (
    "NOT_PLACED"  # eligible capacity exists now but the replica's turn had none
)

SHORTFALL_REASONS: tuple[str, ...] = (
    NO_ELIGIBLE_HOST,
    PREEMPTION_STAGED,
    AWAITING_RELEASE,
    EVICTION_BUDGET,
    PIN_UNSATISFIED,
    RETAINED_NONCOMPLIANT,
    PLACEMENT_BUDGET,
    NOT_PLACED,
    # plus any dynamic feasibility reason (INSUFFICIENT_MEMORY, MODEL_LIMIT, FAILURE_DOMAIN, ...)
)

# --- placement reasons ------------------------------------------------------------------------
INCUMBENT = (
    "INCUMBENT"  # healthy live managed residency that still satisfies every constraint
)
EXTERNAL_RESIDENCY = (
    "EXTERNAL_RESIDENCY"  # unmanaged residency that satisfies demand (never actuated)
)
PINNED_RESIDENCY = "PINNED_RESIDENCY"  # operator-pinned residency (never actuated)
RETAINED_UNTIL_REPLACED = (
    "RETAINED_UNTIL_REPLACED"  # must move; kept until replacements are ready
)
PIN = "PIN"  # new replica on a profile's pinned host
BASELINE = "BASELINE"  # new replica for min_replicas
DIRECT = "DIRECT"  # new replica for direct request/queue/SLO evidence
INFERRED = "INFERRED"  # new replica for correlation-only (predictive) evidence
REPAIRED = "REPAIRED"  # moved by bounded backtracking repair

# --- preemption reasons -----------------------------------------------------------------------
PRIORITY_PREEMPTION = "PRIORITY_PREEMPTION"
MODEL_LIMIT_CONVERGENCE = (
    "MODEL_LIMIT_CONVERGENCE"  # host model ceiling lowered below live inventory
)
COLOCATION_CONVERGENCE = (
    "COLOCATION_CONVERGENCE"  # tightened co-location policy already violated
)
