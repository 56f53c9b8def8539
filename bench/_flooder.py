"""A hostile host's flood, as its own process: `python -m bench._flooder URL CREDS SUBJECT SECONDS MODE
HOST WINDOW`.

A plain nats-py client holding the host's real credential publishes as fast as it can on one
of the host's own subjects for SECONDS: MODE `signed` sends valid heartbeats signed with the
host's own key (each distinct), `junk` unsigned bytes. It prints one JSON line: messages sent
and seconds spent. Separate from the test process so the flood competes with the controller the
way a remote host would (through the server only), not for the controller's own event loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import nats

from grid.events import codec
from grid.events.base import new_event_id
from grid.events.host import HostHeartbeat, HostResources, Residency
from grid.identity.creds import connect_options
from grid.identity.signing import Identity

POOL = 4000
FLUSH_EVERY = 2000


def _pool(creds: Path, subject: str, mode: str, host_id: str) -> list[tuple[bytes, dict[str, str] | None]]:
    if mode == "junk":
        return [(os.urandom(200), None) for _ in range(POOL)]
    identity = Identity.from_creds(creds)
    now = time.time()
    out: list[tuple[bytes, dict[str, str] | None]] = []
    resources = HostResources(capacity_mb=65_536, failure_domain="rack-1", cpu_count=16)
    residency = Residency(model_id="SmolLM2-135M-Instruct.Q4_1.gguf", memory_mb=300, state="ready")
    for i in range(POOL):
        ev = HostHeartbeat(event_id=new_event_id(), at=now + i * 1e-4, host_id=host_id, resources=resources,
                           residencies=(residency,))
        data = codec.encode(ev)
        out.append((data, identity.sign(subject, data)))
    return out


async def main(url: str, creds: Path, subject: str, seconds: float, mode: str, host_id: str,
               window: int) -> None:
    """Publish the pool round and round for `seconds`. `window` > 0: keep at most that many
    publishes awaiting the stream's acknowledgement (as fast as the log will store them: a
    fire-and-forget flood past the server's own ingest rate is dropped by the server, and
    queued there, before any reader sees it); 0: fire and forget."""
    pool = _pool(creds, subject, mode, host_id)
    nc = await nats.connect(url, allow_reconnect=False, **connect_options(creds, None))
    sent = acked = 0
    room = asyncio.Semaphore(window or 1)

    async def on_ack(_msg: object) -> None:
        nonlocal acked
        acked += 1
        room.release()

    inbox = nc.new_inbox()
    if window:
        await nc.subscribe(inbox, cb=on_ack)
    start = time.monotonic()
    deadline = start + seconds
    try:
        while time.monotonic() < deadline:
            for data, headers in pool:
                if window:
                    await room.acquire()
                    await nc.publish(subject, data, headers=headers, reply=inbox)
                else:
                    await nc.publish(subject, data, headers=headers)
                sent += 1
                if sent % FLUSH_EVERY == 0:
                    await nc.flush()
                    if time.monotonic() >= deadline:
                        break
        await nc.flush()
    finally:
        await nc.close()
    print(json.dumps({"sent": sent, "acked": acked, "seconds": time.monotonic() - start}), flush=True)


if __name__ == "__main__":
    url, creds, subject, seconds, mode, host_id, window = sys.argv[1:8]
    asyncio.run(main(url, Path(creds), subject, float(seconds), mode, host_id, int(window)))
