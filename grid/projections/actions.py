"""Actions projection: command lifecycle from issue to terminal ack, and learned timings.

Duplicate and late acks are harmless: the first terminal ack decides the outcome and later
conflicting ones are ignored. A withdrawn (cancelled) command can still be completed by a late
terminal ack, because the node may already have been running it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import cast

import msgspec

from grid.events.acks import TERMINAL_ACK_STATUSES, ActionAck
from grid.events.base import Event
from grid.events.commands import CommandIssued, CommandWithdrawn
from grid.projections.position import Position
from grid.projections.sharedmap import SharedMap, share_fields

# Bounded history: terminal actions beyond this many are forgotten oldest-first.
MAX_TERMINAL_ACTIONS = 4096
# Learned timing: an eight-sample EWMA, authoritative after four samples, expiring after 30 days.
TIMING_ALPHA = 2.0 / (8 + 1)
TIMING_MAX_AGE_SECONDS = 30 * 86_400.0
TIMING_MAX_SECONDS = 3600.0
MAX_EARLY_ACTIONS = 1024
MAX_EARLY_ACKS_PER_ACTION = 4
# Bounded: at most this many (host, model) pairs with a failed load are remembered.
MAX_LOAD_FAILURES = 1024


# The withdrawal reason of a command that expired undelivered: no host accepted it before its lease
# ran out and its host is stale or unknown, so no agent will ever admit it (grid.agent.fencing
# refuses an expired lease). Such a withdrawal ends the command (status EXPIRED) instead of
# leaving it open until a host that may never return answers it.
EXPIRED_UNDELIVERED = "expired_undelivered"
EXPIRED = "expired"


class ActionRecord(msgspec.Struct, frozen=True, kw_only=True):
    command: CommandIssued
    issued_at: float
    issued_seq: int
    # pending | accepted | succeeded | failed | rejected | cancelled | expired
    status: str = "pending"
    withdrawn: bool = False
    withdrawn_reason: str = ""
    message: str = ""
    acked_at: float | None = None
    terminal_at: float | None = None
    duration_seconds: float | None = None
    artifact_fetched: bool = False


class TimingRecord(msgspec.Struct, frozen=True, kw_only=True):
    host_id: str
    model_id: str
    artifact_sha256: str | None
    kind: str  # "warm", "load_fetch" or "load_verify"
    ewma_seconds: float
    samples: int
    updated_at: float


class LoadFailure(msgspec.Struct, frozen=True, kw_only=True):
    """The last failed load of a model on a host (its reason, e.g. artifact_not_cached), kept
    until a later load of it there succeeds, so the controller can say why a replica is missing
    (the agent's log is on another machine)."""

    host_id: str
    model_id: str
    reason: str
    detail: str
    action_id: str
    artifact_sha256: str | None
    at: float


class ActionsState(msgspec.Struct, frozen=True, kw_only=True):
    # `actions` and `timings` are SharedMaps (as FleetState.hosts): a command or an ack copies one
    # bucket of them, not every record (about 5,000 open commands in a 10,000-host wave), and
    # the state it replaces stays as it was (a tick may hold it). Sorted when iterated (every
    # reader sorts the records by issue sequence or sorts the keys); encoded as plain dicts;
    # given dicts (decoded from a snapshot, or built by hand), they are converted here.
    actions: Mapping[str, ActionRecord] = {}
    terminal_order: tuple[str, ...] = ()
    timings: Mapping[str, TimingRecord] = {}
    # Acks that arrived before their command (streams are followed independently): applied
    # when the command arrives, so the fold does not depend on cross-stream interleaving.
    early_acks: dict[str, tuple[tuple[ActionAck, float], ...]] = {}
    # timing_key-like "<host>\x1f<model>" -> the last failed load there (see LoadFailure).
    load_failures: dict[str, LoadFailure] = {}

    def __post_init__(self) -> None:
        share_fields(self, "actions", "timings")


def initial() -> ActionsState:
    return ActionsState()


def timing_key(host_id: str, model_id: str, sha: str | None, kind: str) -> str:
    return f"{host_id}\x1f{model_id}\x1f{sha or ''}\x1f{kind}"


def _learn(state: ActionsState, record: ActionRecord, duration: float | None, fetched: bool,
           at: float) -> Mapping[str, TimingRecord]:
    cmd = record.command
    if duration is None or not math.isfinite(duration) or duration < 0 or duration > TIMING_MAX_SECONDS:
        return state.timings  # invalid reports never poison scheduling
    if cmd.kind == "warm":
        kind = "warm"
    elif cmd.kind == "load":
        kind = "load_fetch" if fetched else "load_verify"
    else:
        return state.timings
    key = timing_key(cmd.host_id, cmd.model_id, cmd.artifact_sha256, kind)
    old = state.timings.get(key)
    if old is None or at - old.updated_at > TIMING_MAX_AGE_SECONDS:
        new = TimingRecord(
            host_id=cmd.host_id, model_id=cmd.model_id, artifact_sha256=cmd.artifact_sha256,
            kind=kind, ewma_seconds=duration, samples=1, updated_at=at,
        )
    else:
        new = msgspec.structs.replace(
            old,
            ewma_seconds=old.ewma_seconds + TIMING_ALPHA * (duration - old.ewma_seconds),
            samples=min(old.samples + 1, 1_000_000),
            updated_at=at,
        )
    return cast(SharedMap[TimingRecord], state.timings).set(key, new)


def failure_key(host_id: str, model_id: str) -> str:
    return f"{host_id}\x1f{model_id}"


def split_reason(message: str) -> tuple[str, str]:
    """An outcome message is "<reason>: <detail>" or just "<reason>"."""
    reason, _, detail = message.partition(": ")
    return reason.strip(), detail.strip()


def _load_failures(state: ActionsState, record: ActionRecord, status: str, message: str,
                   at: float) -> dict[str, LoadFailure]:
    cmd = record.command
    if cmd.kind != "load" or status not in ("succeeded", "failed"):
        return state.load_failures
    key = failure_key(cmd.host_id, cmd.model_id)
    failures = {k: v for k, v in state.load_failures.items() if k != key}
    if status == "failed":
        reason, detail = split_reason(message)
        failures[key] = LoadFailure(host_id=cmd.host_id, model_id=cmd.model_id, reason=reason or "failed",
                                    detail=detail, action_id=cmd.action_id, artifact_sha256=cmd.artifact_sha256,
                                    at=at)
        if len(failures) > MAX_LOAD_FAILURES:
            oldest = min(failures, key=lambda k: (failures[k].at, k))
            failures.pop(oldest)
    return failures


def _with_action(state: ActionsState, record: ActionRecord, *, terminal: bool = False,
                 timings: Mapping[str, TimingRecord] | None = None,
                 load_failures: dict[str, LoadFailure] | None = None) -> ActionsState:
    actions = cast(SharedMap[ActionRecord], state.actions).set(record.command.action_id, record)
    order = state.terminal_order
    if terminal:
        order = order + (record.command.action_id,)
        if len(order) > MAX_TERMINAL_ACTIONS:
            drop = order[: len(order) - MAX_TERMINAL_ACTIONS]
            order = order[len(drop):]
            for action_id in drop:
                actions = actions.without(action_id)
    return ActionsState(
        actions=actions,
        terminal_order=order,
        timings=state.timings if timings is None else timings,
        early_acks=state.early_acks,
        load_failures=state.load_failures if load_failures is None else load_failures,
    )


def apply(state: ActionsState, event: Event, position: Position) -> ActionsState:
    match event:
        case CommandIssued():
            if event.action_id in state.actions:
                return state  # a re-issued identical intent keeps its first record
            record = ActionRecord(command=event, issued_at=position.time, issued_seq=position.seq)
            state = _with_action(state, record)
            early = state.early_acks.get(event.action_id)
            if early:
                state = msgspec.structs.replace(
                    state, early_acks={k: v for k, v in state.early_acks.items() if k != event.action_id}
                )
                for ack, ack_at in early:
                    state = _apply_ack(state, ack, ack_at)
            return state
        case CommandWithdrawn():
            record = state.actions.get(event.action_id)
            if record is None or record.terminal_at is not None:
                return state
            if event.reason == EXPIRED_UNDELIVERED and record.status == "pending":
                return _with_action(state, msgspec.structs.replace(
                    record, status=EXPIRED, withdrawn=True, withdrawn_reason=event.reason, message=event.reason,
                    terminal_at=position.time,
                ), terminal=True)
            # (An expiry folded after the host accepted the command is a plain withdrawal: it may run.)
            return _with_action(
                state, msgspec.structs.replace(record, withdrawn=True, withdrawn_reason=event.reason)
            )
        case ActionAck():
            return _apply_ack(state, event, position.time)
    return state


def _apply_ack(state: ActionsState, event: ActionAck, at: float) -> ActionsState:
    record = state.actions.get(event.action_id)
    if record is None:
        held = state.early_acks.get(event.action_id, ())
        if len(held) >= MAX_EARLY_ACKS_PER_ACTION or (
            not held and len(state.early_acks) >= MAX_EARLY_ACTIONS
        ):
            return state  # bounded: an ack for a command we will never see is dropped
        return msgspec.structs.replace(
            state, early_acks={**state.early_acks, event.action_id: held + ((event, at),)}
        )
    if record.terminal_at is not None:
        return state  # duplicate or conflicting later ack: the first terminal one stands
    if event.status in TERMINAL_ACK_STATUSES:
        timings = (
            _learn(state, record, event.duration_seconds, event.artifact_fetched, at)
            if event.status == "succeeded"
            else None
        )
        updated = msgspec.structs.replace(
            record,
            status=event.status,
            message=event.message,
            acked_at=at,
            terminal_at=at,
            duration_seconds=event.duration_seconds,
            artifact_fetched=event.artifact_fetched,
        )
        return _with_action(state, updated, terminal=True, timings=timings,
                            load_failures=_load_failures(state, record, event.status, event.message, at))
    if record.status == "pending":
        return _with_action(
            state, msgspec.structs.replace(record, status=event.status, acked_at=at, message=event.message)
        )
    return state


def open_actions(state: ActionsState) -> list[ActionRecord]:
    """Issued but not terminal, in issue order."""
    return sorted(
        (r for r in state.actions.values() if r.terminal_at is None), key=lambda r: r.issued_seq
    )
