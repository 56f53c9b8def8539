"""A hostile host's flood, as its own process:
`python -m bench._flooder URL CREDS SUBJECT SECONDS MODE HOST WINDOW [TARGET ...]`.

A plain nats-py client holding the host's real credential floods for SECONDS at its best rate.
MODE:
- `signed`: valid heartbeats signed with the host's own key (each distinct, its time current:
  the pool of signed heartbeats is made afresh each round) on SUBJECT (one of its own); `junk`:
  unsigned random bytes there. WINDOW > 0 keeps at most that many publishes awaiting the
  stream's acknowledgement (as fast as the log stores them: a fire-and-forget flood
  past the server's own ingest rate is queued, then dropped, by the server before any reader sees
  it); 0 fires and forgets.
- `big`: 1 MiB payloads on the host's own subjects, each on a fresh connection (the server
  refuses a message over the credential's payload limit, grid.identity.permissions
  HOST_MAX_PAYLOAD, by closing the connection), and beside them, on one connection with WINDOW
  acks in flight, the largest payloads the server lets through (just under that limit: the
  stream's max_msg_size refuses them) and the largest the stream stores (just under
  HOST_EVENT_MAX_BYTES).
- `reflect`: JetStream API requests the host may or may not make (`<prefix>.STREAM.MSG.GET.*`,
  `<prefix>.STREAM.INFO.KV_grid_lease`, with both prefixes `$JS.API` and `gridjs.API`) whose
  reply subject is one of the TARGETs (control subjects, another host's subjects; a TARGET ending
  in `.*` gets a fresh last token each time), fire and forget, flushed every few hundred;
  permission errors are counted and ignored.
- `subjects`: publishes on `grid.host.<HOST>.<fresh token>` and on each TARGET (subjects it may
  not publish), fire and forget: the server refuses each with a permissions error.

It prints one JSON line `{"started": ...}` when the flood begins and one JSON line at the end:
messages sent, acked, seconds spent, and `counts` by outcome. Separate from the bench's process
so the flood competes with the controller the way a remote host would (through the server only),
not for the controller's own event loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import nats

from grid.events import codec
from grid.events.base import new_event_id
from grid.events.host import HostHeartbeat, HostResources, Residency
from grid.events.lease import LEASE_KEY
from grid.events.subjects import CONTROL_STREAM, HOSTS_STREAM, LEASE_BUCKET, MODE_SUBJECT, host_subject, host_subjects
from grid.identity.creds import connect_options
from grid.identity.permissions import HOST_MAX_PAYLOAD
from grid.identity.signing import Identity
from grid.transport.jetstream import HOST_EVENT_MAX_BYTES

POOL = 4000
FLUSH_EVERY = 2000
FIRE_FLUSH_EVERY = 500
BIG = 1 << 20
PREFIXES = ("$JS.API", "gridjs.API")


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


class Flood:
    def __init__(self, url: str, creds: Path, seconds: float) -> None:
        self.url, self.creds = url, creds
        self.seconds = seconds
        self.counts: collections.Counter[str] = collections.Counter()
        self.sent = self.acked = 0
        self.start = time.monotonic()
        self.deadline = self.start + seconds

    def began(self) -> None:
        self.start = time.monotonic()
        self.deadline = self.start + self.seconds
        print(json.dumps({"started": time.time()}), flush=True)

    @property
    def running(self) -> bool:
        return time.monotonic() < self.deadline

    async def on_error(self, exc: Exception) -> None:
        text = str(exc).lower()
        if "permissions violation" in text:
            self.counts["refused: permissions"] += 1
        elif "maximum payload" in text:
            self.counts["refused: max payload"] += 1
        elif isinstance(exc, (ConnectionResetError, BrokenPipeError)) or "connection" in text:
            self.counts["connection closed by the server"] += 1
        else:
            self.counts[f"error: {type(exc).__name__}"] += 1

    async def connect(self, **kwargs: Any) -> Any:
        return await nats.connect(self.url, allow_reconnect=False, error_cb=self.on_error,
                                  **connect_options(self.creds, None), **kwargs)

    def result(self) -> dict[str, Any]:
        return {"sent": self.sent, "acked": self.acked, "seconds": time.monotonic() - self.start,
                "counts": dict(self.counts)}


async def stream_flood(f: Flood, subject: str, mode: str, host_id: str, window: int) -> None:
    """Publish the pool round and round on `subject` (the original flood: signed or junk)."""
    pool = _pool(f.creds, subject, mode, host_id)
    nc = await f.connect()
    room = asyncio.Semaphore(window or 1)

    async def on_ack(msg: Any) -> None:
        f.acked += 1
        if b'"error"' in msg.data:
            f.counts["refused by the stream"] += 1
        room.release()

    inbox = nc.new_inbox()
    if window:
        await nc.subscribe(inbox, cb=on_ack)
    f.began()
    try:
        while f.running:
            if f.sent and mode == "signed":
                pool = _pool(f.creds, subject, mode, host_id)  # fresh ids and times: every heartbeat valid
            for data, headers in pool:
                if window:
                    await room.acquire()
                    await nc.publish(subject, data, headers=headers, reply=inbox)
                else:
                    await nc.publish(subject, data, headers=headers)
                f.sent += 1
                if f.sent % FLUSH_EVERY == 0:
                    await nc.flush()
                    if not f.running:
                        break
        await nc.flush()
    finally:
        await nc.close()


async def big_flood(f: Flood, host_id: str, window: int) -> None:
    """1 MiB payloads, each on a fresh connection (the server closes it), and beside them the
    largest payloads the server passes and the largest the stream stores, acked."""
    own = host_subjects(host_id)
    at_limit = os.urandom(HOST_MAX_PAYLOAD - 4096)  # under the JWT's limit, over the stream's max_msg_size
    storable = os.urandom(HOST_EVENT_MAX_BYTES - 1024)  # stored: what the host's quota is made of
    oversize = os.urandom(BIG)
    f.began()

    async def oversized() -> None:
        i = 0
        while f.running:
            try:
                nc = await f.connect()
            except Exception as exc:  # noqa: BLE001 - refused connects are part of the outcome
                f.counts[f"connect failed: {type(exc).__name__}"] += 1
                await asyncio.sleep(0.05)
                continue
            f.counts["connections (1 MiB)"] += 1
            try:
                await nc.publish(own[i % len(own)], oversize)
                f.counts["1 MiB sent"] += 1
                f.sent += 1
                i += 1
                with contextlib.suppress(Exception):
                    await nc.flush(timeout=2)
                for _ in range(100):  # the server's answer: -ERR and the connection closed
                    if nc.is_closed or not nc.is_connected:
                        break
                    await asyncio.sleep(0.01)
                if nc.is_connected:
                    f.counts["1 MiB connection still open"] += 1
            finally:
                with contextlib.suppress(Exception):
                    await nc.close()

    async def at_limits() -> None:
        nc = await f.connect()
        room = asyncio.Semaphore(max(1, window))
        pending: dict[str, str] = {}

        async def on_ack(msg: Any) -> None:
            f.acked += 1
            kind = pending.pop(msg.subject, "?")
            f.counts[f"{kind}: {'refused by the stream' if b'error' in msg.data else 'stored'}"] += 1
            room.release()

        prefix = nc.new_inbox()
        await nc.subscribe(prefix + ".*", cb=on_ack)
        n = 0
        try:
            while f.running:
                kind, data = ((f"~{len(at_limit) >> 10} KiB", at_limit) if n % 2 == 0
                              else (f"~{len(storable) >> 10} KiB", storable))
                await room.acquire()
                reply = f"{prefix}.{n}"
                pending[reply] = kind
                try:
                    await nc.publish(own[n % len(own)], data, reply=reply)
                except Exception as exc:  # noqa: BLE001
                    f.counts[f"{kind}: publish failed ({type(exc).__name__})"] += 1
                    room.release()
                    break
                f.counts[f"{kind} sent"] += 1
                f.sent += 1
                n += 1
            with contextlib.suppress(Exception):
                await nc.flush(timeout=5)
            await asyncio.sleep(0.5)
        finally:
            with contextlib.suppress(Exception):
                await nc.close()

    await asyncio.gather(oversized(), at_limits())


def _requests(host_id: str) -> list[tuple[str, bytes]]:
    out = []
    for prefix in PREFIXES:
        out += [
            (f"{prefix}.STREAM.MSG.GET.{HOSTS_STREAM}",
             json.dumps({"last_by_subj": host_subject(host_id, "heartbeat")}).encode()),
            (f"{prefix}.STREAM.MSG.GET.{CONTROL_STREAM}", json.dumps({"last_by_subj": MODE_SUBJECT}).encode()),
            (f"{prefix}.STREAM.INFO.KV_{LEASE_BUCKET}", b""),
            (f"{prefix}.STREAM.MSG.GET.KV_{LEASE_BUCKET}",
             json.dumps({"last_by_subj": f"$KV.{LEASE_BUCKET}.{LEASE_KEY}"}).encode()),
        ]
    return out


async def reflect_flood(f: Flood, host_id: str, targets: list[str]) -> None:
    requests = _requests(host_id)
    nc = await f.connect()
    f.began()
    i = 0
    try:
        while f.running:
            subject, body = requests[i % len(requests)]
            target = targets[(i // len(requests)) % len(targets)]
            if target.endswith(".*"):
                target = f"{target[:-2]}.r{i}"
            await nc.publish(subject, body, reply=target)
            f.counts[f"requests {subject.split('.', 2)[0]}.{subject.split('.', 2)[1]}"] += 1
            f.sent += 1
            i += 1
            if i % FIRE_FLUSH_EVERY == 0:
                await nc.flush(timeout=10)
        await nc.flush(timeout=10)
        await asyncio.sleep(0.5)  # the last permission errors
    finally:
        await nc.close()


async def subjects_flood(f: Flood, host_id: str, targets: list[str]) -> None:
    nc = await f.connect()
    f.began()
    i = 0
    own = host_subject(host_id, "x")[:-2]
    payload = os.urandom(200)
    try:
        while f.running:
            if targets and i % 2 == 1:
                subject = targets[(i // 2) % len(targets)]
            else:
                subject = f"{own}.n{i}"
            await nc.publish(subject, payload)
            f.sent += 1
            i += 1
            if i % FIRE_FLUSH_EVERY == 0:
                await nc.flush(timeout=10)
        await nc.flush(timeout=10)
        await asyncio.sleep(0.5)
    finally:
        await nc.close()


async def main(url: str, creds: Path, subject: str, seconds: float, mode: str, host_id: str,
               window: int, targets: list[str]) -> None:
    f = Flood(url, creds, seconds)
    if mode in ("signed", "junk"):
        await stream_flood(f, subject, mode, host_id, window)
    elif mode == "big":
        await big_flood(f, host_id, window)
    elif mode == "reflect":
        await reflect_flood(f, host_id, targets)
    elif mode == "subjects":
        await subjects_flood(f, host_id, targets)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(json.dumps(f.result()), flush=True)


if __name__ == "__main__":
    url, creds, subject, seconds, mode, host_id, window = sys.argv[1:8]
    asyncio.run(main(url, Path(creds), subject, float(seconds), mode, host_id, int(window), sys.argv[8:]))
