"""A real component retrying after a lost ack stores its event once, on both logs.

The gateway's TelemetryQueue keeps a batch whose append failed and retries it with the same
event id. When the append reached the stream but its ack was lost (the client timed out), only
Nats-Msg-Id dedupe stops the retry from doubling the recorded demand. The lost ack is simulated
at the edge, after the real append: the stream has the message, the caller sees the same
LogError a JetStream request timeout produces.
"""

from __future__ import annotations

import asyncio
from typing import Any

from grid.events import codec
from grid.events.base import Event
from grid.events.log import AppendResult, LogError
from grid.events.requests import RequestBatch, RequestFeatures
from grid.events.subjects import REQUESTS_STREAM
from grid.gateway.telemetry import TelemetryQueue


class LosesFirstAcks:
    """An EventLog whose first `lose` appends are stored but answered with a timeout."""

    def __init__(self, inner: Any, lose: int) -> None:
        self._inner = inner
        self._lose = lose
        self.results: list[AppendResult] = []

    async def append(self, event: Event, **kwargs: Any) -> AppendResult:
        result = await self._inner.append(event, **kwargs)
        self.results.append(result)
        if self._lose > 0:
            self._lose -= 1
            raise LogError(f"append of {event.event_id} timed out")  # what JetStreamLog raises on a lost ack
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def features(i: int) -> RequestFeatures:
    return RequestFeatures(endpoint="chat", requested_model="m.gguf", served_model="m.gguf", host_id="h",
                           input_units=10 + i, output_units=5, service_seconds=0.1, finished_at=float(i))


async def stored_batches(event_log: Any) -> list[RequestBatch]:
    batches = []
    async for msg in event_log.replay(REQUESTS_STREAM):
        event = codec.decode(msg.data)
        assert isinstance(event, RequestBatch)
        batches.append(event)
    return batches


async def test_telemetry_retry_after_a_lost_ack_is_stored_once(event_log) -> None:
    lossy = LosesFirstAcks(event_log, lose=2)
    queue = TelemetryQueue(lossy, source="gateway-test", batch_size=3, flush_seconds=0.05)
    queue.start()
    try:
        for i in range(3):
            assert queue.put(features(i))
        for _ in range(200):
            if queue.flushed_batches:
                break
            await asyncio.sleep(0.05)
    finally:
        await queue.stop()

    assert queue.flushed_batches == 1 and queue.failed_appends == 2, queue.stats()
    # Three appends of one event id reached the log; the two retries were reported duplicates.
    assert len(lossy.results) == 3
    assert [r.duplicate for r in lossy.results] == [False, True, True]
    assert len({r.seq for r in lossy.results}) == 1

    batches = await stored_batches(event_log)
    assert len(batches) == 1 and await event_log.last_sequence(REQUESTS_STREAM) == 1
    assert [r.input_units for r in batches[0].records] == [10, 11, 12]
