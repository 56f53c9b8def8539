"""Lifecycle commands a controller issues to one host, stamped with its fencing authority."""

from __future__ import annotations

from typing import Literal

from grid.events.base import Event

ActionKind = Literal["load", "warm", "drain", "unload", "evict"]
ACTION_KINDS: tuple[str, ...] = ("load", "warm", "drain", "unload", "evict")
# evict deletes a cached artifact from disk: it takes something away, so it is fenced like a drain.
DESTRUCTIVE_KINDS: frozenset[str] = frozenset({"drain", "unload", "evict"})

# The reason a load carries when it is a predictive prefetch (a cache-only advisory: fetch and
# verify, never warm). The agent records the download's provenance from it, and only artifacts
# downloaded this way, never used since, may later be evicted.
PREDICTIVE_PREFETCH = "predictive_prefetch"


class CommandIssued(Event, frozen=True, kw_only=True, tag="command.issued.v1"):
    action_id: str
    kind: ActionKind
    host_id: str
    model_id: str
    memory_mb: int
    generation: str
    controller_term: int
    controller_id: str
    lease_expires_at: float
    # Remaining lease authority when issued; the agent judges it on its own monotonic clock.
    lease_ttl_seconds: float
    dependencies: tuple[str, ...] = ()
    executable: bool = True
    reason: str = ""
    created_at: float = 0.0
    not_before: float = 0.0
    runtime: str = "llama.cpp"
    artifact_sha256: str | None = None
    artifact_source: str | None = None
    artifact_size_mb: int | None = None
    context_size: int = 2048
    slots: int = 1
    # ModelProfile.embeddings: start the engine with its embeddings endpoint.
    embeddings: bool = False


class CommandWithdrawn(Event, frozen=True, kw_only=True, tag="command.withdrawn.v1"):
    action_id: str
    host_id: str
    reason: str
    generation: str = ""
    controller_term: int = 0
    controller_id: str = ""
