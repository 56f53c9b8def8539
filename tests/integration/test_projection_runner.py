"""Live-followed projections equal a rebuild from scratch and a rebuild from snapshot + tail."""

from __future__ import annotations

import asyncio
import random

import pytest

from grid.events.acks import ActionAck
from grid.events.commands import CommandIssued
from grid.events.control import HostOverride, ModelProfile, ModeSet, ProfileRemoved, ProfileSet
from grid.events.host import HostHeartbeat, HostRegistered, HostResources, Residency
from grid.events.subjects import HOSTS_STREAM, host_subject
from grid.projections.runner import ProjectionRunner, ReplayError


def scripted_events(seed: int = 7, n: int = 300) -> list:
    rng = random.Random(seed)
    hosts = [f"host-{i}" for i in range(6)]
    models = [f"model-{i}.gguf" for i in range(4)]
    out: list = [ModeSet(event_id="mode", at=0, mode="recommend")]
    for h in hosts:
        out.append(HostRegistered(event_id=f"reg-{h}", at=0, host_id=h, resources=HostResources(capacity_mb=16000)))
    issued: list[str] = []
    for i in range(n):
        roll = rng.random()
        h = rng.choice(hosts)
        m = rng.choice(models)
        if roll < 0.5:
            res = tuple(
                Residency(model_id=mm, memory_mb=500, state=rng.choice(["ready", "warming", "draining"]), loaded_age_seconds=rng.random() * 100)
                for mm in sorted(rng.sample(models, rng.randint(0, 2)))
            )
            out.append(HostHeartbeat(event_id=f"hb-{i}", at=0, host_id=h, resources=HostResources(capacity_mb=16000), residencies=res,
                                     state=rng.choice(["accepting", "accepting", "throttled", "paused"])))
        elif roll < 0.65:
            out.append(ProfileSet(event_id=f"ps-{i}", at=0, profile=ModelProfile(model_id=m, memory_mb=rng.randint(100, 900))))
        elif roll < 0.7:
            out.append(ProfileRemoved(event_id=f"pr-{i}", at=0, model_id=m))
        elif roll < 0.75:
            out.append(HostOverride(event_id=f"ov-{i}", at=0, host_id=h, state=rng.choice(["draining", None])))
        elif roll < 0.88:
            aid = f"act-{i}"
            issued.append(aid)
            out.append(CommandIssued(event_id=aid, at=0, action_id=aid, kind="warm", host_id=h, model_id=m, memory_mb=500,
                                     generation="e:1:d", controller_term=1, controller_id="c", lease_expires_at=0, lease_ttl_seconds=15))
        elif issued:
            aid = rng.choice(issued)
            out.append(ActionAck(event_id=f"ack-{i}", at=0, host_id=h, action_id=aid,
                                 status=rng.choice(["accepted", "succeeded", "failed", "succeeded"]), duration_seconds=rng.random() * 20))
    return out


async def test_live_follow_equals_rebuild_and_snapshot_plus_tail(js_log, tmp_path) -> None:
    events = scripted_events()
    live = ProjectionRunner()
    follower = asyncio.create_task(live.follow(js_log))
    await asyncio.sleep(0.2)
    half = len(events) // 2
    for e in events[:half]:
        await js_log.append(e)
    # A snapshot taken in the middle of the log.
    mid = ProjectionRunner()
    await mid.catch_up(js_log)
    snap = tmp_path / "snap.json"
    mid.save_snapshot(snap)
    for e in events[half:]:
        await js_log.append(e)
    expected_positions = {s: await js_log.last_sequence(s) for s in live.streams}
    for _ in range(200):
        if all(live.positions.get(s, 0) >= n for s, n in expected_positions.items() if n):
            break
        await asyncio.sleep(0.05)
    follower.cancel()
    with pytest.raises(asyncio.CancelledError):
        await follower

    rebuilt = ProjectionRunner()
    await rebuilt.catch_up(js_log)
    resumed = ProjectionRunner()
    assert resumed.load_snapshot(snap)
    tail = await resumed.catch_up(js_log)
    assert tail > 0
    assert rebuilt.states == live.states
    assert resumed.states == rebuilt.states
    assert resumed.positions == rebuilt.positions == {k: v for k, v in expected_positions.items() if v}
    assert rebuilt["catalog"].profiles and rebuilt["fleet"].hosts and rebuilt["actions"].actions


async def test_malformed_message_is_counted_live_and_fails_strict_replay(js_log) -> None:
    await js_log.append(HostHeartbeat(event_id="ok-1", at=0, host_id="h", resources=HostResources(capacity_mb=1)))
    bad = await js_log.append_raw(host_subject("h", "heartbeat"), b'{"type":"host.heartbeat.v1","event_id":"x"}', msg_id="bad")
    await js_log.append_raw(host_subject("h", "heartbeat"), b'{"type":"no.such.v1","event_id":"y","at":0}', msg_id="unknown")
    await js_log.append(HostHeartbeat(event_id="ok-2", at=0, host_id="h2", resources=HostResources(capacity_mb=1)))

    lenient = ProjectionRunner()
    await lenient.catch_up(js_log)
    assert lenient.malformed == 2
    assert sorted(lenient["fleet"].hosts) == ["h", "h2"]  # nothing else lost
    assert lenient.positions[HOSTS_STREAM] == 4

    strict = ProjectionRunner(strict=True)
    with pytest.raises(ReplayError) as info:
        await strict.catch_up(js_log)
    assert info.value.seq == bad.seq and f"sequence {bad.seq}" in str(info.value)


async def test_corrupt_snapshot_is_quarantined_and_state_rebuilt(js_log, tmp_path) -> None:
    await js_log.append(ProfileSet(event_id="p", at=0, profile=ModelProfile(model_id="m", memory_mb=1)))
    snap = tmp_path / "snap.json"
    snap.write_bytes(b'{"version": 1, "positions": {"GRID_CTL": 99}, "states": {"catalog": [')
    runner = ProjectionRunner()
    assert not runner.load_snapshot(snap)
    assert not snap.exists() and list(tmp_path.glob("snap.json.corrupt-*"))
    assert runner.warnings and "quarantined" in runner.warnings[0]
    await runner.catch_up(js_log)
    assert "m" in runner["catalog"].profiles


async def test_a_snapshot_ending_on_a_skipped_malformed_event_still_matches_the_log(js_log, tmp_path) -> None:
    await js_log.append(HostHeartbeat(event_id="ok", at=0, host_id="h", resources=HostResources(capacity_mb=1)))
    await js_log.append_raw(host_subject("h", "heartbeat"), b'{"type":"no.such.v1","event_id":"y","at":0}', msg_id="odd")
    runner = ProjectionRunner()
    await runner.catch_up(js_log)
    snap = tmp_path / "snap.json"
    runner.save_snapshot(snap)
    resumed = ProjectionRunner()
    assert await resumed.restore_snapshot(snap, js_log)
    assert not resumed.warnings and resumed.positions == runner.positions and resumed.malformed == 1
