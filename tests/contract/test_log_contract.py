"""One contract, two logs: InMemoryLog and JetStream behave the same."""

from __future__ import annotations

import asyncio
import time

import pytest

from grid.events import codec
from grid.events.control import ModelProfile, ProfileSet
from grid.events.host import HostHeartbeat, HostResources
from grid.events.log import ConflictError
from grid.events.plan import PlanCreated
from grid.events.subjects import (
    COMMANDS_STREAM,
    HOSTS_STREAM,
    LEASE_BUCKET,
    PLAN_SUBJECT,
    PLANS_STREAM,
    command_subject,
    subject_for,
)


def heartbeat(i: int, host: str = "host-a") -> HostHeartbeat:
    return HostHeartbeat(event_id=f"hb-{host}-{i}", at=float(i), host_id=host, resources=HostResources(capacity_mb=1024 + i))


def plan(i: int) -> PlanCreated:
    return PlanCreated(
        event_id=f"plan-{i}", at=0.0, planner_version="t", generation=f"e:{i}:d", epoch="e",
        sequence=i, inputs_digest="d", based_on={}, now=0.0,
    )


async def test_append_returns_stream_sequence(event_log) -> None:
    results = [await event_log.append(heartbeat(i)) for i in range(3)]
    assert [r.seq for r in results] == [1, 2, 3]
    assert all(r.stream == HOSTS_STREAM and not r.duplicate for r in results)
    assert await event_log.last_sequence(HOSTS_STREAM) == 3


async def test_retried_append_with_same_msg_id_is_a_reported_noop(event_log) -> None:
    first = await event_log.append(heartbeat(1))
    again = await event_log.append(heartbeat(1))
    assert again.duplicate and again.seq == first.seq
    assert await event_log.last_sequence(HOSTS_STREAM) == 1


async def test_expected_last_subject_sequence_conflict(event_log) -> None:
    r1 = await event_log.append(plan(1), expected_last_subject_seq=0)
    r2 = await event_log.append(plan(2), expected_last_subject_seq=r1.seq)
    assert r2.seq == r1.seq + 1
    with pytest.raises(ConflictError):
        await event_log.append(plan(3), expected_last_subject_seq=r1.seq)  # stale writer
    assert await event_log.last_subject_sequence(PLAN_SUBJECT) == r2.seq
    assert await event_log.last_sequence(PLANS_STREAM) == 2


async def test_last_subject_sequence_is_per_subject(event_log) -> None:
    await event_log.append(heartbeat(1, "a"))
    await event_log.append(heartbeat(2, "b"))
    await event_log.append(heartbeat(3, "a"))
    assert await event_log.last_subject_sequence(subject_for(heartbeat(0, "a"))) == 3
    assert await event_log.last_subject_sequence(subject_for(heartbeat(0, "b"))) == 2
    assert await event_log.last_subject_sequence(subject_for(heartbeat(0, "c"))) == 0


async def test_ordered_replay_from_sequence_to_end(event_log) -> None:
    for i in range(10):
        await event_log.append(heartbeat(i))
    seqs = [m.seq async for m in event_log.replay(HOSTS_STREAM, start_seq=4, end_seq=7)]
    assert seqs == [4, 5, 6, 7]
    everything = [m async for m in event_log.replay(HOSTS_STREAM)]
    assert [m.seq for m in everything] == list(range(1, 11))
    assert [codec.decode(m.data) for m in everything] == [heartbeat(i) for i in range(10)]
    times = [m.time for m in everything]
    assert times == sorted(times) and abs(times[0] - time.time()) < 60


async def test_replay_from_start_time(event_log) -> None:
    for i in range(3):
        await event_log.append(heartbeat(i))
    await asyncio.sleep(0.05)
    cut = time.time()
    await asyncio.sleep(0.05)
    for i in range(3, 6):
        await event_log.append(heartbeat(i))
    after = [m.seq async for m in event_log.replay(HOSTS_STREAM, start_time=cut)]
    assert after == [4, 5, 6]
    before = [m.seq async for m in event_log.replay(HOSTS_STREAM, end_time=cut)]
    assert before == [1, 2, 3]


async def test_replay_of_empty_stream_and_past_end(event_log) -> None:
    assert [m async for m in event_log.replay(HOSTS_STREAM)] == []
    await event_log.append(heartbeat(1))
    assert [m async for m in event_log.replay(HOSTS_STREAM, start_seq=5)] == []


async def test_live_ordered_subscription_sees_new_events(event_log) -> None:
    await event_log.append(heartbeat(0))
    sub = await event_log.subscribe(HOSTS_STREAM, start_seq=1)
    first = await sub.next(timeout=5)
    assert first is not None and first.seq == 1
    assert await sub.next(timeout=0.2) is None
    await event_log.append(heartbeat(1))
    second = await sub.next(timeout=5)
    assert second is not None and second.seq == 2
    await sub.close()


async def test_next_without_waiting_takes_only_what_has_arrived_and_loses_nothing(event_log) -> None:
    # A follower drains what has arrived after every message it waited for (a batch whose
    # signatures one worker-thread call checks): next(timeout=0) must return at once when
    # nothing is there, and never drop a message arriving meanwhile.
    sub = await event_log.subscribe(HOSTS_STREAM, start_seq=1)
    started = time.monotonic()
    assert await sub.next(timeout=0) is None
    assert time.monotonic() - started < 0.1
    seen: list[int] = []

    async def write() -> None:
        for i in range(200):
            await event_log.append(heartbeat(i))
            if i % 10 == 0:
                await asyncio.sleep(0)

    writer = asyncio.create_task(write())
    while len(seen) < 200:
        msg = await sub.next(timeout=5)
        assert msg is not None
        seen.append(msg.seq)
        while (more := await sub.next(timeout=0)) is not None:
            seen.append(more.seq)
    await writer
    assert seen == list(range(1, 201))
    await sub.close()


async def test_closing_the_log_does_not_wait_for_messages_nobody_reads(event_log) -> None:
    # A reader that stopped (a cancelled task, Ctrl-C on `gridctl test watch`) leaves delivered
    # messages queued; closing must not wait for them (nats-py's drain would, up to 30 s).
    for i in range(5):
        await event_log.append(heartbeat(i))
    ordered = await event_log.subscribe(HOSTS_STREAM, start_seq=1)
    durable = await event_log.subscribe(HOSTS_STREAM, durable="closing-reader")
    assert (await ordered.next(timeout=5)) is not None
    assert (await durable.next(timeout=5)) is not None  # fetched, never acknowledged
    await asyncio.sleep(0.2)  # the rest of the stream reaches the ordered consumer's queue
    started = time.monotonic()
    await asyncio.wait_for(event_log.close(), 20)
    assert time.monotonic() - started < 10


async def test_durable_subscription_redelivers_unacked_after_resubscribe(event_log) -> None:
    host = "agent.1"
    subject = command_subject(host)
    for i in range(3):
        await event_log.append_raw(subject, f'{{"n":{i}}}'.encode(), msg_id=f"c{i}")
    sub = await event_log.subscribe(COMMANDS_STREAM, durable="agent-1", subject_filter=subject)
    m1 = await sub.next(timeout=5)
    assert m1 is not None and m1.seq == 1
    await sub.ack(m1)
    m2 = await sub.next(timeout=5)
    assert m2 is not None and m2.seq == 2
    await sub.close()  # m2 never acked: handed back
    again = await event_log.subscribe(COMMANDS_STREAM, durable="agent-1", subject_filter=subject)
    redelivered = await again.next(timeout=5)
    assert redelivered is not None and redelivered.seq == 2
    await again.ack(redelivered)
    m3 = await again.next(timeout=5)
    assert m3 is not None and m3.seq == 3
    await again.ack(m3)
    await again.close()


async def test_kv_compare_and_set(event_log) -> None:
    assert await event_log.kv_get(LEASE_BUCKET, "controller") is None
    rev1 = await event_log.kv_put(LEASE_BUCKET, "controller", b"term-1", expected_revision=0)
    with pytest.raises(ConflictError):
        await event_log.kv_put(LEASE_BUCKET, "controller", b"other", expected_revision=0)
    rev2 = await event_log.kv_put(LEASE_BUCKET, "controller", b"term-2", expected_revision=rev1)
    with pytest.raises(ConflictError):
        await event_log.kv_put(LEASE_BUCKET, "controller", b"stale", expected_revision=rev1)
    entry = await event_log.kv_get(LEASE_BUCKET, "controller")
    assert entry is not None and entry.value == b"term-2" and entry.revision == rev2


async def test_subjects_escape_dotted_model_ids(event_log) -> None:
    profile = ProfileSet(event_id="p", at=0.0, profile=ModelProfile(model_id="SmolLM2-135M-Instruct.Q4_1.gguf", memory_mb=300))
    result = await event_log.append(profile)
    [msg] = [m async for m in event_log.replay(result.stream)]
    assert msg.subject == "grid.ctl.profile.SmolLM2-135M-Instruct_2EQ4_5F1_2Egguf"
    assert codec.decode(msg.data) == profile
