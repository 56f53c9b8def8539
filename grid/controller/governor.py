"""Mutation governor: concurrency limits, exact-artifact fanout and per-key failure backoff.

Pure bookkeeping used by the reconciler within one tick. The limits bound change (safety
invariant 8): a global and a per-host ceiling on concurrent mutations (open commands count,
new ones are charged as they are admitted), an independent fanout ceiling per exact artifact
for loads, and exponential backoff per (kind, host, model) after failed attempts.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from grid.fleet import FUTURE_SKEW_SECONDS, HEARTBEAT_TIMEOUT_SECONDS
from grid.projections.actions import ActionRecord

# Terminal statuses that count as a failed attempt for backoff. "cancelled" is our own
# withdrawal being honoured and never penalises a retry.
FAILURE_STATUSES: frozenset[str] = frozenset({"failed", "rejected"})
# A rejection because a dependency had not succeeded is the dependency's failure, not this one's.
_NOT_OWN_FAILURE_PREFIXES: tuple[str, ...] = ("dependency_not_succeeded",)

# Reasons a candidate could not get a slot.
GLOBAL_LIMIT = "global_mutation_limit"
HOST_LIMIT = "host_mutation_limit"
ARTIFACT_FANOUT = "artifact_fanout_limit"


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    max_global_mutations: int = 8
    # One at a time per host: the agent runs one side effect at a time and judges each
    # command's lease TTL when it starts, so a queued second command would only expire.
    max_host_mutations: int = 1
    # Concurrent loads of one exact artifact (sha256, else model id) across the fleet.
    artifact_fanout: int = 2
    backoff_base_seconds: float = 15.0
    backoff_max_seconds: float = 900.0
    # A host silent for longer than this is stale: no new work, and its open commands stop
    # consuming the global budget (they still hold that host's slots).
    heartbeat_timeout_seconds: float = HEARTBEAT_TIMEOUT_SECONDS
    future_skew_seconds: float = FUTURE_SKEW_SECONDS
    # An operator drain is a make-before-break evacuation: a ready replica on a draining host
    # keeps serving until its replacement is ready, or until this long after the host entered
    # the draining state (then it drains even if it is the last replica).
    evacuation_deadline_seconds: float = 60.0


def artifact_key(model_id: str, sha256: str | None) -> str:
    return f"sha:{sha256}" if sha256 else f"model:{model_id}"


def backoff_seconds(limits: Limits, consecutive_failures: int) -> float:
    if consecutive_failures <= 0:
        return 0.0
    exponent = min(consecutive_failures - 1, 30)
    return min(limits.backoff_base_seconds * (2.0**exponent), limits.backoff_max_seconds)


class BackoffState(msgspec.Struct, frozen=True):
    failures: int
    last_failure_at: float
    not_before: float


def backoff_index(limits: Limits, records: Iterable[ActionRecord]) -> dict[tuple[str, str, str], BackoffState]:
    """(kind, host, model) -> consecutive failures since the last success, and when to retry."""
    by_key: dict[tuple[str, str, str], list[ActionRecord]] = {}
    for r in records:
        if r.terminal_at is None:
            continue
        cmd = r.command
        by_key.setdefault((cmd.kind, cmd.host_id, cmd.model_id), []).append(r)
    out: dict[tuple[str, str, str], BackoffState] = {}
    for key in sorted(by_key):
        rs = sorted(by_key[key], key=lambda r: (r.terminal_at or 0.0, r.issued_seq))
        failures = 0
        last_at = 0.0
        for r in reversed(rs):
            if r.status in FAILURE_STATUSES:
                if r.status == "rejected" and r.message.startswith(_NOT_OWN_FAILURE_PREFIXES):
                    continue
                failures += 1
                last_at = max(last_at, r.terminal_at or 0.0)
            elif r.status == "succeeded":
                break
        if failures:
            out[key] = BackoffState(failures, last_at, last_at + backoff_seconds(limits, failures))
    return out


class Governor:
    """Slot accounting for one tick. Charge open commands first, then admit candidates in order."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.global_used = 0
        self.host_used: dict[str, int] = {}
        self.fanout_used: dict[str, int] = {}

    def charge_open(self, host_id: str, kind: str, akey: str, *, counts_globally: bool) -> None:
        if counts_globally:
            self.global_used += 1
        self.host_used[host_id] = self.host_used.get(host_id, 0) + 1
        if kind == "load":
            self.fanout_used[akey] = self.fanout_used.get(akey, 0) + 1

    def refusal(self, host_id: str, kind: str, akey: str, *, slots: int = 1) -> str | None:
        """Why `slots` more mutations on `host_id` cannot start now (None = they can)."""
        if kind == "load" and self.fanout_used.get(akey, 0) + 1 > self.limits.artifact_fanout:
            return ARTIFACT_FANOUT
        if self.host_used.get(host_id, 0) + slots > self.limits.max_host_mutations:
            return HOST_LIMIT
        if self.global_used + slots > self.limits.max_global_mutations:
            return GLOBAL_LIMIT
        return None

    def admit(self, host_id: str, kind: str, akey: str) -> None:
        self.global_used += 1
        self.host_used[host_id] = self.host_used.get(host_id, 0) + 1
        if kind == "load":
            self.fanout_used[akey] = self.fanout_used.get(akey, 0) + 1
