"""Reconciler output into log events: the one place an `Action` becomes a `CommandIssued` and a
`Withdrawal` becomes a `CommandWithdrawn` (pure).

Every command carries the fencing stamp an agent checks (grid.agent.fencing): the controller's
id and lease term, and the plan generation ``make_generation(epoch, sequence, inputs_digest)``
whose epoch/sequence order the agent enforces. The controller, the lab, the tests and the
benches all issue through here, so a field added to `Action` reaches the agent everywhere.
"""

from __future__ import annotations

import msgspec

from grid.controller.reconcile import WITHDRAW_EXPIRED_UNDELIVERED, Action, ReconcileResult, Withdrawal
from grid.events.commands import CommandIssued, CommandWithdrawn


class Issuer(msgspec.Struct, frozen=True, kw_only=True):
    """Who issues: the controller, its lease term, and the recorded plan the commands follow."""

    controller_id: str
    controller_term: int
    # "<epoch>:<sequence>:<inputs_digest>" (grid.events.plan.make_generation).
    generation: str


def command_issued(action: Action, issuer: Issuer, *, issued_at: float,
                   lease_remaining: float) -> CommandIssued:
    """The command for `action`, issued at `issued_at` with `lease_remaining` seconds of lease
    authority left (the agent judges that on its own monotonic clock)."""
    return CommandIssued(
        event_id=action.action_id, at=issued_at, action_id=action.action_id, kind=action.kind,  # type: ignore[arg-type]
        host_id=action.host_id, model_id=action.model_id, memory_mb=action.memory_mb,
        generation=issuer.generation, controller_term=issuer.controller_term,
        controller_id=issuer.controller_id, lease_expires_at=issued_at + lease_remaining,
        lease_ttl_seconds=round(lease_remaining, 3), dependencies=action.dependencies, executable=True,
        reason=action.reason, created_at=issued_at, not_before=issued_at, runtime=action.runtime,
        artifact_sha256=action.artifact_sha256, artifact_source=action.artifact_source,
        artifact_size_mb=action.artifact_size_mb, context_size=action.context_size, slots=action.slots,
        embeddings=action.embeddings,
    )


def command_withdrawn(withdrawal: Withdrawal, issuer: Issuer, *, at: float) -> CommandWithdrawn:
    """The withdrawal of an open command (event id derived from the action id: a retry dedupes).
    An expiry has its own id: it may follow an earlier withdrawal of the same command, which the
    log's duplicate window would otherwise swallow."""
    prefix = "expire" if withdrawal.reason == WITHDRAW_EXPIRED_UNDELIVERED else "withdraw"
    return CommandWithdrawn(
        event_id=f"{prefix}-{withdrawal.action_id}", at=at, action_id=withdrawal.action_id,
        host_id=withdrawal.host_id, reason=withdrawal.reason, generation=issuer.generation,
        controller_term=issuer.controller_term, controller_id=issuer.controller_id,
    )


def decision_events(result: ReconcileResult, issuer: Issuer, *, at: float,
                    lease_remaining: float) -> tuple[CommandWithdrawn | CommandIssued, ...]:
    """A whole decision as log events in append order: the withdrawals first (an agent drops
    them before the commands that replace them arrive), then the commands in the reconciler's
    order. For callers whose lease cannot run out mid-decision (the controller service checks
    its lease per command)."""
    return (tuple(command_withdrawn(w, issuer, at=at) for w in result.withdrawals)
            + tuple(command_issued(a, issuer, issued_at=at, lease_remaining=lease_remaining)
                    for a in result.actions))


__all__ = ["Issuer", "command_issued", "command_withdrawn", "decision_events"]
