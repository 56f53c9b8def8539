"""What an action ends with: an Outcome (ack status + message) and the message vocabulary.

Rejections and cancellations decided before any side effect use grid.agent.fencing's reasons;
these are the messages of actions that ran.
"""

from __future__ import annotations

from dataclasses import dataclass

# Ack messages (status "failed" unless noted).
MSG_STARTED = "started"  # status "accepted" (non-terminal)
MSG_INTERRUPTED = "interrupted_by_restart"
MSG_WITHDRAWN = "withdrawn"  # status "cancelled"
MSG_READY = "ready"
MSG_ALREADY_READY = "already_ready"
MSG_DRAINED = "drained"
MSG_ALREADY_ABSENT = "already_absent"
MSG_UNLOADED = "unloaded"
MSG_RUNTIME_UNAVAILABLE = "runtime_unavailable"
MSG_INSUFFICIENT_MEMORY = "insufficient_free_memory"
MSG_NO_FREE_PORT = "no_free_port"
MSG_SPAWN_FAILED = "spawn_failed"
MSG_PERSIST_FAILED = "persist_failed"
MSG_ENGINE_EXITED = "engine_exited"
MSG_READINESS_TIMEOUT = "readiness_timeout"
MSG_RESIDENCY_BUSY = "residency_busy"
MSG_FENCED = "ownership_unproven"
MSG_NOT_DRAINED = "not_drained"
MSG_ACTIVITY_UNKNOWN = "activity_unknown"
MSG_REQUESTS_IN_FLIGHT = "requests_in_flight"
MSG_DRAIN_DEADLINE = "drain_deadline_exceeded"
MSG_STOP_TIMED_OUT = "stop_timed_out"
MSG_INTERNAL_ERROR = "internal_error"

# evict: "evicted" carries the bytes reclaimed; every refusal deletes nothing.
MSG_EVICTED = "evicted"
MSG_EVICT_NEEDS_SHA256 = "evict_needs_exact_sha256"
MSG_EVICT_SHA256_DIFFERS = "cached_sha256_differs"
MSG_EVICT_NOT_PREDICTIVE = "not_predictive_cache"  # an operator's cache, or a download since used
MSG_EVICT_UNKNOWN_PROVENANCE = "provenance_unknown"  # a blob the index does not describe
MSG_EVICT_PINNED = "artifact_pinned"
MSG_EVICT_MODEL_ACTIVE = "model_active"
MSG_EVICT_ARTIFACT_IN_USE = "artifact_in_use"  # another model on this host or in the index uses the blob
MSG_EVICT_FAILED = "evict_failed"

# Residency notes (heartbeat-visible through residency state; kept in the state file).
NOTE_ADOPTED = "adopted"
NOTE_FENCED = "fenced: ownership unproven, never signalled"
NOTE_EXITED = "engine exited"
NOTE_UNHEALTHY = "adopted but not healthy"


@dataclass
class Outcome:
    status: str
    message: str
    fetched: bool = False
