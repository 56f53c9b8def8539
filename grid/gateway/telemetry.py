"""Request features to the log through a bounded, non-blocking queue, flushed as RequestBatch.

`put` never awaits and never raises: a full queue drops the record and counts it. A flusher
task appends a batch when `batch_size` records are waiting or one `flush_seconds` after the
oldest waiting record arrived. A failed append keeps that one batch (same event id, so a
retry is deduplicated by Nats-Msg-Id) and retries with backoff while new records keep
queueing up to the bound; after `max_attempts` the batch is dropped and counted. Telemetry can
therefore never delay or fail inference, even when NATS is down.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import structlog

from grid.backoff import Backoff
from grid.clock import Clock, SystemClock
from grid.events.base import new_event_id
from grid.events.log import EventLog
from grid.events.requests import MAX_BATCH_RECORDS, RequestBatch, RequestFeatures
from grid.tasks import cancel_and_wait

log = structlog.get_logger(__name__)

DEFAULT_BATCH_SIZE = 256
DEFAULT_FLUSH_SECONDS = 1.0
DEFAULT_MAX_QUEUE = 8192
APPEND_TIMEOUT_SECONDS = 3.0
MAX_ATTEMPTS = 8
MAX_RETRY_DELAY_SECONDS = 5.0
# Waits between attempts at one batch: 0.25 s doubling to MAX_RETRY_DELAY_SECONDS, so a short
# outage (a NATS restart) delays the batch by about a second, while a batch that fails
# MAX_ATTEMPTS times is dropped after about 18 s of waiting. No jitter, so that bound is exact.
RETRY_BACKOFF = Backoff(first=0.25, cap=MAX_RETRY_DELAY_SECONDS)


class TelemetryQueue:
    def __init__(
        self,
        event_log: EventLog,
        *,
        source: str,
        clock: Clock | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        flush_seconds: float = DEFAULT_FLUSH_SECONDS,
        max_queue: int = DEFAULT_MAX_QUEUE,
        append_timeout: float = APPEND_TIMEOUT_SECONDS,
    ) -> None:
        self._log = event_log
        self._source = source
        self._clock = clock or SystemClock()
        self._batch_size = max(1, min(batch_size, MAX_BATCH_RECORDS))
        self._flush_seconds = flush_seconds
        self._max_queue = max(1, max_queue)
        self._append_timeout = append_timeout
        self._queue: collections.deque[RequestFeatures] = collections.deque()
        self._oldest_at: float | None = None  # loop time of the oldest waiting record
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._pending: RequestBatch | None = None
        self._attempts = 0
        # counters
        self.accepted = 0
        self.dropped = 0  # queue full
        self.dropped_failed = 0  # records of batches that could not be appended
        self.flushed_batches = 0
        self.flushed_records = 0
        self.failed_appends = 0
        self.last_error: str | None = None

    # --- request path (synchronous, never blocks) ------------------------------------------------

    def put(self, record: RequestFeatures) -> bool:
        if len(self._queue) >= self._max_queue:
            self.dropped += 1
            return False
        self._queue.append(record)
        self.accepted += 1
        if self._oldest_at is None:
            try:
                self._oldest_at = asyncio.get_running_loop().time()
            except RuntimeError:
                self._oldest_at = 0.0
            self._wake.set()
        elif len(self._queue) >= self._batch_size:
            self._wake.set()
        return True

    def __len__(self) -> int:
        return len(self._queue)

    def stats(self) -> dict[str, Any]:
        return {
            "queued": len(self._queue),
            "pending_retry": 0 if self._pending is None else len(self._pending.records),
            "accepted": self.accepted,
            "dropped": self.dropped,
            "dropped_failed": self.dropped_failed,
            "flushed_batches": self.flushed_batches,
            "flushed_records": self.flushed_records,
            "failed_appends": self.failed_appends,
            "last_error": self.last_error,
            "max_queue": self._max_queue,
            "batch_size": self._batch_size,
        }

    # --- flusher ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="grid-gateway-telemetry")

    async def stop(self, *, final_flush_timeout: float = 1.0) -> None:
        task, self._task = self._task, None
        await cancel_and_wait([task])
        # One last bounded attempt to write what is waiting.
        try:
            await asyncio.wait_for(self.flush_all(), final_flush_timeout)
        except (TimeoutError, Exception) as exc:  # noqa: BLE001 - shutdown must not raise
            self.last_error = type(exc).__name__

    async def flush_all(self) -> None:
        while self._pending is not None or self._queue:
            if not await self._flush_once():
                return

    def _take(self) -> RequestBatch | None:
        if self._pending is not None:
            return self._pending
        if not self._queue:
            return None
        n = min(self._batch_size, len(self._queue))
        records = tuple(self._queue.popleft() for _ in range(n))
        if self._queue:
            try:
                self._oldest_at = asyncio.get_running_loop().time()
            except RuntimeError:
                self._oldest_at = 0.0
        else:
            self._oldest_at = None
        self._pending = RequestBatch(
            event_id=new_event_id(), at=self._clock.now(), source=self._source, records=records
        )
        self._attempts = 0
        return self._pending

    async def _flush_once(self) -> bool:
        batch = self._take()
        if batch is None:
            return True
        self._attempts += 1
        try:
            await asyncio.wait_for(self._log.append(batch), self._append_timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any log failure is counted, never propagated
            self.failed_appends += 1
            self.last_error = f"{type(exc).__name__}: {str(exc)[:200]}"
            if self._attempts >= MAX_ATTEMPTS:
                self.dropped_failed += len(batch.records)
                self._pending = None
                log.warning("telemetry batch dropped", records=len(batch.records), error=self.last_error)
            return False
        self.flushed_batches += 1
        self.flushed_records += len(batch.records)
        self._pending = None
        return True

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self._pending is None and not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            if self._pending is None and len(self._queue) < self._batch_size:
                oldest = self._oldest_at if self._oldest_at is not None else loop.time()
                remaining = oldest + self._flush_seconds - loop.time()
                if remaining > 0:
                    self._wake.clear()
                    try:
                        await asyncio.wait_for(self._wake.wait(), remaining)
                    except TimeoutError:
                        pass
                    if len(self._queue) < self._batch_size and loop.time() < oldest + self._flush_seconds:
                        continue
            ok = await self._flush_once()
            if not ok and self._pending is not None:
                await asyncio.sleep(RETRY_BACKOFF.delay(self._attempts))
