"""Single writer: lease races, takeover, stale writers, fenced consumers, SIGKILL + restart."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import sys
from pathlib import Path

import pytest

from grid.agent import fencing
from grid.controller.service import Controller, ControllerSettings
from grid.events import codec
from grid.events.base import new_event_id
from grid.events.commands import CommandIssued
from grid.events.control import ModelProfile, ModeSet, ProfileSet
from grid.events.log import ConflictError
from grid.events.plan import PlanCreated
from grid.events.subjects import PLANS_STREAM
from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import JetStreamLog

from tests.integration.controller.simhost import SimHost, commands_in_log, wait_for

RACE = ControllerSettings(tick_interval_seconds=0.2, coalesce_seconds=0.02, lease_ttl_seconds=1.5,
                          lease_renew_seconds=0.25, lease_margin_seconds=0.3, restart_grace_seconds=0.0,
                          plan_refresh_seconds=0.5)


def profile(model: str, replicas: int) -> ModelProfile:
    return ModelProfile(model_id=model, memory_mb=1000, min_replicas=replicas, max_replicas=replicas,
                        min_residency_seconds=0.0, scale_down_cooldown_seconds=0.0)


async def plans_in_log(log: JetStreamLog) -> list[PlanCreated]:
    return [e for e in [codec.decode(m.data) async for m in log.replay(PLANS_STREAM)] if isinstance(e, PlanCreated)]


def one_writer_per_term(items: list) -> dict[int, set[str]]:  # type: ignore[type-arg]
    by_term: dict[int, set[str]] = collections.defaultdict(set)
    for c in items:
        by_term[c.controller_term].add(c.controller_id)
    return by_term


async def test_two_controllers_racing_never_share_a_term(nats_server: EmbeddedNats, js_log: JetStreamLog,
                                                          tmp_path: Path) -> None:
    hosts = [SimHost(f"h{i}") for i in range(4)]
    for h in hosts:
        await h.heartbeat(js_log)
        h.start(js_log)
    await js_log.append(ProfileSet(event_id=new_event_id(), at=0, profile=profile("a", 2)))
    await js_log.append(ModeSet(event_id=new_event_id(), at=0, mode="automatic"))
    log_a = await JetStreamLog.connect(nats_server.url)
    log_b = await JetStreamLog.connect(nats_server.url)
    a = Controller(log_a, tmp_path / "a", settings=RACE, controller_id="ctl-a")
    b = Controller(log_b, tmp_path / "b", settings=RACE, controller_id="ctl-b")
    try:
        await asyncio.gather(a.start(), b.start())
        await wait_for(lambda: sum(1 for h in hosts if h.residencies.get("a") == "ready") == 2, timeout=15)
        first = a if a.lease.held else b
        other = b if first is a else a
        assert not other.lease.held
        # The holder stalls (no more renewals, e.g. a long GC pause); the standby takes over.
        for t in first._tasks:
            if t.get_name() == "controller-lease":
                t.cancel()
        await wait_for(lambda: other.lease.held, timeout=10)
        assert other.lease.term > first.lease.term
        assert not first.lease.held  # its own monotonic authority has run out
        # New work for the new leader.
        await js_log.append(ProfileSet(event_id=new_event_id(), at=0, profile=profile("b", 2)))
        await wait_for(lambda: sum(1 for h in hosts if h.residencies.get("b") == "ready") == 2, timeout=15)
        cmds = await commands_in_log(js_log)
        plans = await plans_in_log(js_log)
        assert {len(ids) for ids in one_writer_per_term(cmds).values()} == {1}
        assert {len(ids) for ids in one_writer_per_term(plans).values()} == {1}
        assert {c.controller_id for c in cmds if c.model_id == "b"} == {other.controller_id}
        assert len({c.action_id for c in cmds}) == len(cmds)
        # Terms strictly increase across the takeover: everything the new leader issued carries
        # a higher term than anything the old one issued...
        old_terms = {c.controller_term for c in cmds if c.controller_id == first.controller_id}
        new_terms = {c.controller_term for c in cmds if c.controller_id == other.controller_id}
        assert old_terms == {first.lease.term} and new_terms == {other.lease.term}
        assert max(old_terms) < min(new_terms)
        # ...and no simulated host ever executed a lower term after a higher one (real agent fencing).
        for h in hosts:
            executed = [cmd.controller_term for cmd in h.executed]
            assert executed == sorted(executed), (h.host_id, executed)
        assert {cmd.controller_term for h in hosts for cmd in h.executed} == old_terms | new_terms
    finally:
        await asyncio.gather(a.stop(), b.stop())
        await log_a.close()
        await log_b.close()
        for h in hosts:
            await h.stop()


async def test_stale_controller_can_append_neither_plan_nor_command(nats_server: EmbeddedNats, js_log: JetStreamLog,
                                                                     tmp_path: Path) -> None:
    host = SimHost("h1")
    await host.heartbeat(js_log)
    await js_log.append(ProfileSet(event_id=new_event_id(), at=0, profile=profile("m", 1)))
    log_a = await JetStreamLog.connect(nats_server.url)
    log_b = await JetStreamLog.connect(nats_server.url)
    a = Controller(log_a, tmp_path / "a", settings=RACE, controller_id="ctl-a")
    b = Controller(log_b, tmp_path / "b", settings=RACE, controller_id="ctl-b")
    try:
        await a.start()
        await wait_for(lambda: a.last_tick is not None and a.last_tick.plan_recorded)
        stale_plan_position = a.runner.positions[PLANS_STREAM]
        # Freeze A entirely (a long pause): no renewals, no ticks.
        for t in a._tasks:
            t.cancel()
        await b.start()
        await wait_for(lambda: b.lease.held, timeout=10)
        await js_log.append(ModeSet(event_id=new_event_id(), at=0, mode="automatic"))
        await wait_for(lambda: b.last_tick is not None and b.last_tick.published > 0 or b.published_total > 0)
        assert b.lease.term == a.lease.term + 1
        # A wakes up believing it still holds the lease (a wall clock that jumped, say).
        a.lease._valid_until = a.clock.monotonic() + 60
        assert a.lease.held
        before_cmds, before_plans = len(await commands_in_log(js_log)), len(await plans_in_log(js_log))
        await a.runner.catch_up(log_a)
        report = await a.tick("stale")
        assert report.published == 0 and not report.plan_recorded
        assert not a.lease.held  # verify() re-read the KV entry and stepped down
        assert len(await commands_in_log(js_log)) == before_cmds
        assert len(await plans_in_log(js_log)) == before_plans
        # The log itself refuses a plan appended against the sequence A had folded.
        stale = PlanCreated(event_id=new_event_id(), at=0, planner_version="x", generation="e:1:d", epoch="e",
                            sequence=1, inputs_digest="d", based_on={}, now=0.0, controller_id="ctl-a",
                            controller_term=a.lease.term)
        with pytest.raises(ConflictError):
            await log_a.append(stale, expected_last_subject_seq=stale_plan_position)
        # And a command A managed to publish in its old term is refused by a fenced consumer
        # that has seen the new term (the real agent's admission chain).
        new_cmd = next(c for c in await commands_in_log(js_log) if c.controller_id == "ctl-b")
        fence = fencing.advance_fence(fencing.CommandFence(), new_cmd)
        old_cmd = CommandIssued(**{**{f: getattr(new_cmd, f) for f in new_cmd.__struct_fields__},
                                   "controller_term": a.lease.term, "controller_id": "ctl-a",
                                   "action_id": "old", "event_id": "old"})
        verdict = fencing.check_command(old_cmd, host_id="h1", fence=fence, lease_remaining_seconds=10.0,
                                        dependency_status={}, protection_state="accepting")
        assert not verdict.ok and verdict.reason == fencing.REASON_STALE_TERM
    finally:
        await asyncio.gather(a.stop(), b.stop())
        await log_a.close()
        await log_b.close()


async def _spawn(nats_url: str, home: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "grid.cli.main", "serve", "controller", "--nats", nats_url, "--home", str(home), "--no-admin",
        "--assume-durable",
        "--tick-interval", "0.3", "--lease-ttl", "3", "--lease-renew", "0.5", "--restart-grace", "0",
        "--publish-pause", "0.25", "--artifact-fanout", "8",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, start_new_session=True,
    )


async def test_sigkill_mid_tick_then_restart_issues_no_duplicate_command(nats_server: EmbeddedNats,
                                                                         js_log: JetStreamLog, tmp_path: Path) -> None:
    hosts = [SimHost(f"h{i}", respond=False) for i in range(6)]  # commands stay pending
    for h in hosts:
        await h.heartbeat(js_log)
    await js_log.append(ProfileSet(event_id=new_event_id(), at=0, profile=profile("m", 6)))
    await js_log.append(ModeSet(event_id=new_event_id(), at=0, mode="automatic"))
    home = tmp_path / "home"
    proc = await _spawn(nats_server.url, home)
    try:
        # Kill it in the middle of its first command batch (6 loads, 0.25 s apart).
        await wait_for(lambda: commands_in_log(js_log), timeout=30, interval=0.02)
        before = await commands_in_log(js_log)
        os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()
        assert 1 <= len(before) < 6
        proc = await _spawn(nats_server.url, home)
        await wait_for(lambda: _count(js_log, 6), timeout=30, interval=0.1)
        await asyncio.sleep(1.5)  # a few more ticks: still nothing new
        cmds = await commands_in_log(js_log)
        per_intent = collections.Counter((c.kind, c.host_id, c.model_id) for c in cmds)
        assert per_intent == {("load", f"h{i}", "m"): 1 for i in range(6)}
        assert len({c.action_id for c in cmds}) == 6
        # Same persistent controller id, new incarnation: reclaimed at once with a higher term.
        terms = sorted({c.controller_term for c in cmds})
        assert len({c.controller_id for c in cmds}) == 1 and terms[-1] > terms[0]
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def _count(log: JetStreamLog, n: int) -> bool:
    return len(await commands_in_log(log)) >= n
