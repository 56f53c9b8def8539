"""Pure admission checks for one command, run before any side effect.

The chain's order is written once here, each check with a REASON constant:
1. right host            -- a command for another host is never executed
2. executable            -- recommendations are not orders
3. known kind
4. controller term       -- lower terms are refused forever; one controller id per term
5. lease TTL             -- judged on the local monotonic clock from receipt
6. plan generation       -- within one epoch the sequence never goes back
7. dependencies          -- each must have a persisted "succeeded" receipt
8. local protection      -- a host that does not admit new work cancels load/warm
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from grid.events.commands import ACTION_KINDS, CommandIssued
from grid.events.plan import parse_generation
from grid.fleet import ADMITTING_HOST_STATES

REASON_WRONG_HOST = "wrong_host"
REASON_NOT_EXECUTABLE = "not_executable"
REASON_UNKNOWN_KIND = "unknown_kind"
REASON_STALE_TERM = "stale_term"
REASON_TERM_CONTROLLER_CONFLICT = "term_controller_conflict"
REASON_LEASE_EXPIRED = "lease_expired"
REASON_NOT_LEASE_HOLDER = "not_lease_holder"
REASON_NOT_LEASE_SIGNER = "not_lease_signer"
REASON_MALFORMED_GENERATION = "malformed_generation"
REASON_STALE_GENERATION = "stale_generation"
REASON_DEPENDENCY_NOT_SUCCEEDED = "dependency_not_succeeded"
REASON_PROTECTION_REJECTS_ADMISSION = "protection_rejects_admission"

ADMISSION_KINDS: frozenset[str] = frozenset({"load", "warm"})


class CommandFence(msgspec.Struct, frozen=True, kw_only=True):
    """The agent's durable command fence: the highest controller term seen, its controller, and the
    latest plan generation. `check_command` refuses a command behind it; `advance_fence` moves it."""

    highest_term: int = 0
    term_controller_id: str = ""
    generation_epoch: str = ""
    generation_sequence: int = -1


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    # "rejected" (invalid command) or "cancelled" (valid, but local safety refuses it).
    status: str = ""
    reason: str = ""
    detail: str = ""

    @property
    def message(self) -> str:
        return f"{self.reason}: {self.detail}" if self.detail else self.reason


ACCEPT = Verdict(ok=True)


def _reject(reason: str, detail: str = "") -> Verdict:
    return Verdict(ok=False, status="rejected", reason=reason, detail=detail)


def check_lease_holder(cmd: CommandIssued, holder_id: str | None, holder_term: int | None) -> Verdict:
    """A command must come from the controller the lease names, in the lease's term.

    The server's permissions already keep everyone but the controller off `grid.cmd.*`; this is
    the second line, checked before the fence moves, so a future permission mistake cannot
    hand the fleet (or its fence) to a forger. No readable lease refuses too."""
    if holder_id is None:
        return _reject(REASON_NOT_LEASE_HOLDER, "no lease holder could be read")
    if cmd.controller_id != holder_id or cmd.controller_term != holder_term:
        return _reject(REASON_NOT_LEASE_HOLDER, f"term {cmd.controller_term} is not the lease's term {holder_term}")
    return ACCEPT


def not_lease_signer(command_signer: str, lease_signer: str) -> Verdict:
    """A command signed by another key than the one that signed the lease it claims."""
    return _reject(REASON_NOT_LEASE_SIGNER,
                   f"signed by {command_signer[:12] or 'nobody'}, the lease by {lease_signer[:12] or 'nobody'}")


def check_command(
    cmd: CommandIssued,
    *,
    host_id: str,
    fence: CommandFence,
    lease_remaining_seconds: float,
    dependency_status: Mapping[str, str],
    protection_state: str,
) -> Verdict:
    if cmd.host_id != host_id:
        return _reject(REASON_WRONG_HOST, f"command for {cmd.host_id!r}")
    if not cmd.executable:
        return _reject(REASON_NOT_EXECUTABLE)
    if cmd.kind not in ACTION_KINDS:
        return _reject(REASON_UNKNOWN_KIND, str(cmd.kind))
    if cmd.controller_term < fence.highest_term:
        return _reject(REASON_STALE_TERM, f"term {cmd.controller_term} < {fence.highest_term}")
    if (
        cmd.controller_term == fence.highest_term
        and fence.term_controller_id
        and cmd.controller_id != fence.term_controller_id
    ):
        return _reject(REASON_TERM_CONTROLLER_CONFLICT, f"term {cmd.controller_term} belongs to another controller")
    if not lease_remaining_seconds > 0.0:
        return _reject(REASON_LEASE_EXPIRED, f"{lease_remaining_seconds:.3f}s left")
    try:
        epoch, sequence, _ = parse_generation(cmd.generation)
    except ValueError:
        return _reject(REASON_MALFORMED_GENERATION, cmd.generation[:80])
    if epoch == fence.generation_epoch and sequence < fence.generation_sequence:
        return _reject(REASON_STALE_GENERATION, f"sequence {sequence} < {fence.generation_sequence}")
    for dep in cmd.dependencies:
        status = dependency_status.get(dep)
        if status != "succeeded":
            return _reject(REASON_DEPENDENCY_NOT_SUCCEEDED, f"{dep} is {status or 'unknown'}")
    if cmd.kind in ADMISSION_KINDS and protection_state not in ADMITTING_HOST_STATES:
        return Verdict(
            ok=False, status="cancelled", reason=REASON_PROTECTION_REJECTS_ADMISSION, detail=protection_state
        )
    return ACCEPT


def advance_fence(fence: CommandFence, cmd: CommandIssued) -> CommandFence:
    """The fence after accepting `cmd` (call only when check_command said ok)."""
    epoch, sequence, _ = parse_generation(cmd.generation)
    if epoch == fence.generation_epoch:
        sequence = max(sequence, fence.generation_sequence)
    if cmd.controller_term > fence.highest_term:
        term, controller = cmd.controller_term, cmd.controller_id
    else:
        term, controller = fence.highest_term, fence.term_controller_id or cmd.controller_id
    return CommandFence(
        highest_term=term,
        term_controller_id=controller,
        generation_epoch=epoch,
        generation_sequence=sequence,
    )


def lease_remaining(
    ttl_seconds: float,
    *,
    received_mono: float,
    now_mono: float,
    age_at_receipt: float = 0.0,
) -> float:
    """Lease time left now, on the local monotonic clock.

    `age_at_receipt` is how long the command had already waited in the log when we received it,
    measured on the log server's clock (server-now estimate minus the message's server timestamp),
    so a command that sat in the stream while the agent was down does not get its TTL afresh.
    """
    return ttl_seconds - max(0.0, age_at_receipt) - max(0.0, now_mono - received_mono)
