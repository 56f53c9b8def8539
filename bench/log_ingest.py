"""Append throughput: our EventLog vs raw nats-py JetStream publishes of the same bytes.

Same run, same embedded server configuration (file store, sync_interval: always), same window
of in-flight publishes. Also: request features ingested per second as batched events.

    python -m bench.log_ingest [--events 4000] [--window 64]
"""

from __future__ import annotations

import argparse
import asyncio

from bench._common import Timer, embedded_server, heartbeat, request_record
from grid.events import codec
from grid.events.requests import RequestBatch
from grid.events.subjects import subject_for
from grid.transport.jetstream import JetStreamLog


async def windowed(n: int, window: int, fn) -> None:  # type: ignore[no-untyped-def]
    sem = asyncio.Semaphore(window)

    async def one(i: int) -> None:
        async with sem:
            await fn(i)

    await asyncio.gather(*(one(i) for i in range(n)))


async def append_rates(log: JetStreamLog, events: int, window: int, rounds: int) -> tuple[float, float]:
    """Median heartbeat appends/s through our `append` and through raw `js.publish` of the same
    bytes with the same msg id and window, rounds interleaved to cancel drift in disk and CPU."""
    js = log.client.jetstream()
    beats = [heartbeat(i) for i in range(events * rounds * 2)]
    payloads = [(subject_for(e), codec.encode(e), e.event_id) for e in beats]
    ours, raw = [], []
    offset = 0
    for _ in range(rounds):
        chunk = beats[offset : offset + events]
        with Timer() as t:
            await windowed(events, window, lambda i: log.append(chunk[i]))
        ours.append(events / t.seconds)
        offset += events
        pchunk = payloads[offset : offset + events]
        with Timer() as t:
            await windowed(
                events, window,
                lambda i: js.publish(pchunk[i][0], pchunk[i][1], headers={"Nats-Msg-Id": pchunk[i][2]}),
            )
        raw.append(events / t.seconds)
        offset += events
    return sorted(ours)[len(ours) // 2], sorted(raw)[len(raw) // 2]


async def main(events: int, window: int, batch: int, rounds: int) -> None:
    with embedded_server() as server:
        log = await JetStreamLog.connect(server.url)
        ours_rate, raw_rate = await append_rates(log, events, window, rounds)
        print(f"heartbeat appends/s  ours={ours_rate:,.0f}  raw nats-py={raw_rate:,.0f}  "
              f"ratio={ours_rate / raw_rate:.2f} (goal >= 0.8; window={window}, {events} events x {rounds} rounds)")

        records = tuple(request_record(i) for i in range(batch))
        n_batches = max(1, (events * 4) // batch)
        batches = [RequestBatch(event_id=f"rb-{i}", at=0.0, source="bench", records=records) for i in range(n_batches)]
        with Timer() as t:
            await windowed(n_batches, window, lambda i: log.append(batches[i]))
        print(f"request features ingested/s = {n_batches * batch / t.seconds:,.0f} "
              f"({n_batches} batches of {batch}; goal >= 50,000/s)")
        await log.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--events", type=int, default=3000)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    asyncio.run(main(a.events, a.window, a.batch, a.rounds))
