"""Command admission through the real log: fencing, redelivery, withdrawal, restart."""

from __future__ import annotations

import msgspec
import pytest

from grid.agent import fencing
from grid.agent.state import AgentState, InFlight, StateStore
from grid.events import codec
from grid.events.commands import CommandWithdrawn
from grid.events.subjects import command_subject
from grid.transport.jetstream import JetStreamLog

from tests.integration.agent.agentkit import HOST, heartbeats, make_command, terminal_acks, wait_ack, wait_for


def _check(cmd, **kw):
    args = dict(
        host_id=HOST, fence=fencing.CommandFence(), lease_remaining_seconds=10.0,
        dependency_status={}, protection_state="accepting",
    )
    args.update(kw)
    return fencing.check_command(cmd, **args)


def test_check_chain_reasons():
    a = fencing.CommandFence(highest_term=5, term_controller_id="c5", generation_epoch="e", generation_sequence=7)
    cases = [
        (make_command(host_id="other"), {}, fencing.REASON_WRONG_HOST),
        (make_command(executable=False), {}, fencing.REASON_NOT_EXECUTABLE),
        (make_command(term=4, controller_id="c5", epoch="e", sequence=9), {"fence": a}, fencing.REASON_STALE_TERM),
        (make_command(term=5, controller_id="zz", epoch="e", sequence=9), {"fence": a},
         fencing.REASON_TERM_CONTROLLER_CONFLICT),
        (make_command(), {"lease_remaining_seconds": 0.0}, fencing.REASON_LEASE_EXPIRED),
        (make_command(term=5, controller_id="c5", epoch="e", sequence=6), {"fence": a},
         fencing.REASON_STALE_GENERATION),
        (make_command(dependencies=("d1",)), {"dependency_status": {"d1": "failed"}},
         fencing.REASON_DEPENDENCY_NOT_SUCCEEDED),
        (make_command(kind="warm"), {"protection_state": "paused"}, fencing.REASON_PROTECTION_REJECTS_ADMISSION),
    ]
    for cmd, kw, reason in cases:
        verdict = _check(cmd, **kw)
        assert not verdict.ok and verdict.reason == reason, (reason, verdict)
    assert _check(make_command(kind="warm"), protection_state="paused").status == "cancelled"
    assert _check(make_command(kind="drain"), protection_state="paused").ok  # destructive work still runs
    # Same term, same controller, same or newer sequence: fine. A new epoch is a new sequence space.
    assert _check(make_command(term=5, controller_id="c5", epoch="e", sequence=7), fence=a).ok
    assert _check(make_command(term=5, controller_id="c5", epoch="f", sequence=0), fence=a).ok
    assert _check(make_command(term=6, controller_id="new", epoch="e", sequence=1), fence=a).reason == \
        fencing.REASON_STALE_GENERATION
    adv = fencing.advance_fence(a, make_command(term=6, controller_id="new", epoch="f", sequence=3))
    assert (adv.highest_term, adv.term_controller_id, adv.generation_epoch, adv.generation_sequence) == (6, "new", "f", 3)


def test_lease_remaining_uses_monotonic_receipt_and_log_age():
    assert fencing.lease_remaining(10.0, received_mono=100.0, now_mono=104.0) == pytest.approx(6.0)
    assert fencing.lease_remaining(10.0, received_mono=100.0, now_mono=104.0, age_at_receipt=7.0) == pytest.approx(-1.0)


async def test_stale_term_refused_even_after_restart(js_log: JetStreamLog, start_agent):
    agent = await start_agent()
    await js_log.append(make_command("t5", "drain", term=5, controller_id="ctl-5"))
    ack = await wait_ack(js_log, "t5")
    assert ack.status == "succeeded" and ack.message == "already_absent" and ack.controller_term == 5
    await agent.stop(drain=True)

    agent = await start_agent()
    assert agent.state.highest_term == 5
    await js_log.append(make_command("t4", "drain", term=4, controller_id="ctl-4"))
    await js_log.append(make_command("t5b", "drain", term=5, controller_id="impostor"))
    await js_log.append(make_command("t6", "drain", term=6, controller_id="ctl-6"))
    assert (await wait_ack(js_log, "t4")).message.startswith(fencing.REASON_STALE_TERM)
    assert (await wait_ack(js_log, "t5b")).message.startswith(fencing.REASON_TERM_CONTROLLER_CONFLICT)
    assert (await wait_ack(js_log, "t6")).status == "succeeded"
    hb = await wait_for(lambda: _latest_term(js_log, 6))
    assert hb.highest_term == 6


async def _latest_term(log, term):
    hbs = await heartbeats(log)
    return hbs[-1] if hbs and hbs[-1].highest_term == term else None


async def test_rejections_each_get_one_terminal_ack_with_reason(js_log: JetStreamLog, start_agent):
    await start_agent()
    await js_log.append(make_command("g9", "drain", sequence=9))
    await wait_ack(js_log, "g9")
    await js_log.append(make_command("g8", "drain", sequence=8))
    await js_log.append(make_command("expired", "drain", sequence=9, ttl=0.0))
    await js_log.append(make_command("dep", "drain", sequence=9, dependencies=("never-seen",)))
    await js_log.append(make_command("rec", "drain", sequence=9, executable=False))
    # A command for another host smuggled onto our subject is rejected, not executed.
    alien = make_command("alien", "drain", host_id="someone-else", sequence=9)
    await js_log.append_raw(command_subject(HOST), codec.encode(alien), msg_id=alien.event_id)
    expected = {
        "g8": fencing.REASON_STALE_GENERATION,
        "expired": fencing.REASON_LEASE_EXPIRED,
        "dep": fencing.REASON_DEPENDENCY_NOT_SUCCEEDED,
        "rec": fencing.REASON_NOT_EXECUTABLE,
        "alien": fencing.REASON_WRONG_HOST,
    }
    for action_id, reason in expected.items():
        ack = await wait_ack(js_log, action_id)
        assert ack.status == "rejected" and ack.message.startswith(reason), (action_id, ack)
        assert ack.duration_seconds is not None and ack.duration_seconds >= 0
    acks = await terminal_acks(js_log)
    assert sorted(a.action_id for a in acks) == sorted(["g9", *expected])


async def test_duplicates_and_redelivery_are_noops(js_log: JetStreamLog, start_agent):
    agent = await start_agent()
    first = make_command("dup", "drain")
    await js_log.append(first)
    await wait_ack(js_log, "dup")
    # The same action id under a new event id (a controller retry) and after a restart.
    await js_log.append(msgspec.structs.replace(first, event_id="retry-1"))
    await agent.stop(drain=True)
    await start_agent()
    await js_log.append(msgspec.structs.replace(first, event_id="retry-2"))
    await js_log.append(make_command("after", "drain"))
    await wait_ack(js_log, "after")
    assert len(await terminal_acks(js_log, "dup")) == 1


async def test_withdrawn_before_start_is_cancelled(js_log: JetStreamLog, start_agent, grid_config):
    # Withdrawal that reaches the agent before the command (or while it is still queued).
    await start_agent()
    await js_log.append(CommandWithdrawn(event_id="w1", at=0.0, action_id="gone", host_id=HOST, reason="mode changed"))
    await js_log.append(make_command("gone", "drain"))
    await js_log.append(make_command("kept", "drain"))
    ack = await wait_ack(js_log, "gone")
    assert ack.status == "cancelled" and ack.message.startswith("withdrawn")
    await wait_ack(js_log, "kept")
    assert len(await terminal_acks(js_log, "gone")) == 1


async def test_protection_override_cancels_admission(js_log: JetStreamLog, start_agent, grid_config):
    from grid.agent.overrides import make_override, write_override
    from grid.agent.state import AgentPaths

    paths = AgentPaths.for_config(grid_config)
    paths.ensure()
    write_override(paths.override, make_override("pause", reason="battery use", now=0.0, for_seconds=None))
    agent = await start_agent()
    assert agent.protection.state == "paused"
    await js_log.append(make_command("w", "warm", model_id="m1"))
    ack = await wait_ack(js_log, "w")
    assert ack.status == "cancelled" and ack.message == "protection_rejects_admission: paused"
    hbs = await heartbeats(js_log)
    assert hbs[-1].state == "paused"


async def test_interrupted_action_fails_after_restart(js_log: JetStreamLog, start_agent, grid_config):
    from grid.agent.state import AgentPaths

    paths = AgentPaths.for_config(grid_config)
    paths.ensure()
    paths.host_id.write_text(HOST + "\n")
    StateStore(paths.state).save(
        AgentState(host_id=HOST, in_flight=InFlight(action_id="half", kind="load", model_id="m1", started_at=1.0))
    )
    agent = await start_agent()
    ack = await wait_ack(js_log, "half")
    assert ack.status == "failed" and ack.message == "interrupted_by_restart"
    assert agent.state.in_flight is None
    # Its redelivered command (still unacked in the log) is a no-op now.
    await js_log.append(make_command("half", "load"))
    await js_log.append(make_command("next", "drain"))
    await wait_ack(js_log, "next")
    assert len(await terminal_acks(js_log, "half")) == 1
