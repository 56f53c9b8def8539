"""The bounded, non-blocking telemetry queue (over the in-process log twin)."""

from __future__ import annotations

import asyncio
import time

from grid.events import codec
from grid.events.log import InMemoryLog
from grid.events.requests import RequestBatch, RequestFeatures
from grid.events.subjects import REQUESTS_STREAM
from grid.gateway.telemetry import TelemetryQueue


def rec(i: int) -> RequestFeatures:
    return RequestFeatures(endpoint="chat", requested_model="m", served_model="m", input_units=i, workload="general")


async def batches(log: InMemoryLog) -> list[RequestBatch]:
    out = []
    async for msg in log.replay(REQUESTS_STREAM):
        event = codec.decode(msg.data)
        assert isinstance(event, RequestBatch)
        out.append(event)
    return out


async def test_flushes_a_full_batch_at_once_and_the_rest_within_a_second() -> None:
    log = InMemoryLog()
    q = TelemetryQueue(log, source="test", batch_size=10, flush_seconds=1.0)
    q.start()
    try:
        t0 = time.monotonic()
        for i in range(25):
            assert q.put(rec(i))
        for _ in range(50):
            await asyncio.sleep(0.02)
            if q.flushed_records >= 20:
                break
        assert q.flushed_records == 20 and time.monotonic() - t0 < 0.9  # two full batches, no waiting
        while q.flushed_records < 25:
            await asyncio.sleep(0.02)
        assert time.monotonic() - t0 < 1.5  # the remainder within about a second
        got = await batches(log)
        assert [len(b.records) for b in got] == [10, 10, 5]
        assert [r.input_units for b in got for r in b.records] == list(range(25))
        assert all(b.source == "test" for b in got)
    finally:
        await q.stop()


async def test_a_full_queue_drops_and_counts_without_blocking() -> None:
    log = InMemoryLog()
    q = TelemetryQueue(log, source="test", batch_size=256, max_queue=5)
    t0 = time.perf_counter()
    results = [q.put(rec(i)) for i in range(8)]
    assert time.perf_counter() - t0 < 0.05
    assert results == [True] * 5 + [False] * 3
    assert q.stats()["dropped"] == 3 and q.stats()["queued"] == 5
    await q.stop()  # final flush writes what was queued
    assert sum(len(b.records) for b in await batches(log)) == 5


async def test_stop_flushes_what_is_waiting() -> None:
    log = InMemoryLog()
    q = TelemetryQueue(log, source="test", flush_seconds=60.0)
    q.start()
    q.put(rec(1))
    await q.stop()
    assert q.flushed_records == 1 and len(await batches(log)) == 1
