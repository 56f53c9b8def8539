"""A command to a dead host does not stay pending forever: once its lease has run out with no host
accepting it, and its host is stale, it expires (a terminal "expired" with its reason) instead of
holding its slot, and a pending drain stops blocking its model. A command the host accepted stays
open (it may be running); a fresh host's queue answers for itself."""

from __future__ import annotations

from grid.controller.governor import Limits
from grid.controller.issue import Issuer, command_withdrawn
from grid.controller.reconcile import WITHDRAW_EXPIRED_UNDELIVERED, Action
from grid.events.subjects import COMMANDS_STREAM
from grid.projections import actions as actions_proj
from grid.projections.position import Position
from tests.unit.controller.ctlkit import NOW, History, host, mkplan, placement, profile, profiles, reconcile_hosts, res

LIMITS = Limits()
LEASE = 15.0  # ctlkit's command_for issues with 15 s of lease
PAST_LEASE = NOW + LEASE + LIMITS.future_skew_seconds + 1.0
STALE_HB = NOW - 1.0  # last heard at issue time; stale by PAST_LEASE + the heartbeat timeout


def drain(host_id: str = "h1", model: str = "m") -> Action:
    return Action(action_id=f"drain-{host_id}-{model}", kind="drain", host_id=host_id, model_id=model,
                  memory_mb=1000, reason="drain_obsolete", destructive=True)


def fold_withdrawals(history: History, result, at: float) -> History:  # type: ignore[no-untyped-def]
    issuer = Issuer(controller_id="c", controller_term=1, generation="e:00000000000000000002:d")
    for w in result.withdrawals:
        history.cmd_seq += 1
        history.state = actions_proj.apply(history.state, command_withdrawn(w, issuer, at=at),
                                           Position(COMMANDS_STREAM, history.cmd_seq, at))
    return history


def test_a_pending_drain_to_a_dead_host_expires_and_ends():
    now = PAST_LEASE + LIMITS.heartbeat_timeout_seconds
    dead = host("h1", res("m"), hb_at=STALE_HB)
    other = host("h2", res("m"), hb_at=now - 1.0)
    plan = mkplan(placement("m", "h2", status="kept"))
    hist = History().issue(drain(), at=NOW)
    result = reconcile_hosts(plan, [dead, other], hist.state, profiles(profile("m")), now=now)
    assert [(w.action_id, w.reason, w.delivered) for w in result.withdrawals] == [
        ("drain-h1-m", WITHDRAW_EXPIRED_UNDELIVERED, False)]
    assert "drain-h1-m" not in result.in_flight and not result.blocked
    # Folded, the withdrawal ends the command: terminal, "expired", with its reason.
    fold_withdrawals(hist, result, now)
    record = hist.state.actions["drain-h1-m"]
    assert (record.status, record.message, record.terminal_at) == ("expired", WITHDRAW_EXPIRED_UNDELIVERED, now)
    again = reconcile_hosts(plan, [dead, other], hist.state, profiles(profile("m")), now=now + 1)
    assert not again.withdrawals and not again.in_flight and not again.blocked
    # The dead host's copy is left to the stale-host rule: no new drain while it is silent.
    assert {(d.kind, d.host_id, d.reason) for d in again.deferred} >= {("drain", "h1", "host_stale")}


def test_a_withdrawn_pending_drain_to_a_dead_host_expires_instead_of_blocking_forever():
    now = PAST_LEASE + LIMITS.heartbeat_timeout_seconds
    dead = host("h1", res("m"), hb_at=STALE_HB)
    hist = History().issue(drain(), at=NOW).withdraw(drain(), at=NOW + 1)
    result = reconcile_hosts(mkplan(), [dead], hist.state, profiles(profile("m")), now=now)
    assert [w.reason for w in result.withdrawals] == [WITHDRAW_EXPIRED_UNDELIVERED]
    assert not result.blocked
    fold_withdrawals(hist, result, now)
    assert hist.state.actions["drain-h1-m"].status == "expired"


def test_accepted_commands_fresh_hosts_and_live_leases_are_left_alone():
    now = PAST_LEASE + LIMITS.heartbeat_timeout_seconds
    profs = profiles(profile("m"))
    # Accepted by the host before it died: it may be running; it stays open.
    accepted = History().issue(drain(), at=NOW).ack(drain(), "accepted", at=NOW + 0.5)
    r1 = reconcile_hosts(mkplan(), [host("h1", res("m"), hb_at=STALE_HB)], accepted.state, profs, now=now)
    assert not r1.withdrawals and "drain-h1-m" in r1.in_flight
    # A fresh host: its own queue judges the lease (it answers lease_expired).
    r2 = reconcile_hosts(mkplan(), [host("h1", res("m"), hb_at=now - 1.0)], History().issue(drain(), at=NOW).state,
                         profs, now=now)
    assert not [w for w in r2.withdrawals if w.reason == WITHDRAW_EXPIRED_UNDELIVERED]
    # A stale host, but the lease (plus the skew allowance) is not over yet.
    early = NOW + LEASE
    r3 = reconcile_hosts(mkplan(), [host("h1", res("m"), hb_at=early - LIMITS.heartbeat_timeout_seconds - 5)],
                         History().issue(drain(), at=NOW).state, profs, now=early)
    assert not r3.withdrawals


def test_an_expiry_folded_after_the_host_accepted_is_a_plain_withdrawal():
    hist = History().issue(drain(), at=NOW).ack(drain(), "accepted", at=NOW + 0.5)
    issuer = Issuer(controller_id="c", controller_term=1, generation="g")
    from grid.controller.reconcile import Withdrawal
    w = Withdrawal(action_id="drain-h1-m", host_id="h1", model_id="m", kind="drain", reason=WITHDRAW_EXPIRED_UNDELIVERED)
    ev = command_withdrawn(w, issuer, at=NOW + 60)
    assert ev.event_id == "expire-drain-h1-m"  # not deduplicated against an earlier withdrawal
    state = actions_proj.apply(hist.state, ev, Position(COMMANDS_STREAM, 99, NOW + 60))
    record = state.actions["drain-h1-m"]
    assert (record.status, record.withdrawn, record.terminal_at) == ("accepted", True, None)
