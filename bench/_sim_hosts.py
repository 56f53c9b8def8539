"""Lightweight simulated hosts for bench.fleet_scale: many in one process, nothing served.

Each host connects with its own credential (so it signs its own events, and the server holds
it to its own subjects), appends a signed HostHeartbeat every `interval` seconds (first one at a
random offset, so a fleet's heartbeats are spread), reads its commands through the durable
consumer the controller provisioned for it, and executes each by acknowledging it: an accepted
ack at once, a succeeded terminal ack after the command's modelled duration, its residencies
changed as a real agent's would be. There is no engine and no inference responder.

    python -m bench._sim_hosts NATS_URL HOSTS_FILE STATS_FILE [--interval 5]

HOSTS_FILE lists `host_id creds_path` per line; STATS_FILE receives a JSON line of counters
every second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

from grid.agent.acks import accepted_ack, terminal_ack
from grid.agent.credential import command_consumer
from grid.agent.state import Receipt
from grid.events import codec
from grid.events.base import new_event_id
from grid.events.commands import CommandIssued, CommandWithdrawn
from grid.events.host import ACTUATOR_CAPABILITIES, HostHeartbeat, HostLoad, HostResources, Residency
from grid.events.subjects import COMMANDS_STREAM, command_subject
from grid.identity.connect import connect_log

CAPACITY_MB = 32768
RESERVED_MB = 2048
DOMAINS = 64
# Modelled execution time of each command kind, seconds (the engine start dominates a load).
DURATIONS = {"load": 4.0, "warm": 1.0, "drain": 1.0, "unload": 0.5}
# During execution, the residency state a real agent reports for each kind (None: removed at the end).
RUNNING_STATE = {"load": "loading", "warm": "warming", "drain": "draining", "unload": "unloading"}
FINAL_STATE = {"load": "ready", "warm": "ready", "drain": "draining", "unload": None}
# The long-poll on the command consumer: a real agent polls every 0.2 s, which at thousands of
# hosts per process is thousands of pull requests a second; the simulated host waits longer.
COMMAND_POLL_SECONDS = 5.0
# The longest pause between a host's connection attempts.
CONNECT_RETRY_MAX_SECONDS = 15.0


class Stats:
    def __init__(self) -> None:
        self.connected = 0
        self.connect_retries = 0
        self.connect_error = ""  # the latest failed attempt's reason
        self.heartbeats = 0
        self.heartbeat_errors = 0
        self.commands = 0
        self.acks = 0
        self.ack_errors = 0
        self.append_seconds: list[float] = []

    def doc(self) -> dict[str, object]:
        xs = sorted(self.append_seconds)
        self.append_seconds.clear()
        return {"at": time.time(), "connected": self.connected, "connect_retries": self.connect_retries,
                "connect_error": self.connect_error,
                "heartbeats": self.heartbeats,
                "heartbeat_errors": self.heartbeat_errors, "commands": self.commands, "acks": self.acks,
                "ack_errors": self.ack_errors,
                "append_p50_ms": xs[len(xs) // 2] * 1000 if xs else None,
                "append_p99_ms": xs[min(len(xs) - 1, int(len(xs) * 0.99))] * 1000 if xs else None}


class SimHost:
    def __init__(self, host_id: str, creds: Path, index: int, stats: Stats) -> None:
        self.host_id = host_id
        self.creds = creds
        self.stats = stats
        self.resources = HostResources(capacity_mb=CAPACITY_MB, reserved_mb=RESERVED_MB, runtimes=("llama.cpp",),
                                       backends=("cpu",), failure_domain=f"rack-{index % DOMAINS:02d}",
                                       cpu_count=8)
        self.residencies: dict[str, Residency] = {}
        self.highest_term = 0
        self.done: set[str] = set()
        self.log = None
        self.sub = None

    async def connect(self, url: str) -> None:
        self.log = await connect_log(url, credentials=self.creds, name=f"sim-{self.host_id}", ensure_streams=False)
        self.stats.connected += 1

    def heartbeat(self) -> HostHeartbeat:
        now = time.time()
        return HostHeartbeat(
            event_id=new_event_id(), at=now, host_id=self.host_id, resources=self.resources,
            residencies=tuple(self.residencies[m] for m in sorted(self.residencies)),
            disk_free_bytes=200 << 30, disk_total_bytes=500 << 30,
            load=HostLoad(active_tasks=0, queue_depth=0, cpu_percent=5.0,
                          memory_used_mb=RESERVED_MB + sum(r.memory_mb for r in self.residencies.values())),
            actuator_capabilities=ACTUATOR_CAPABILITIES, highest_term=self.highest_term,
        )

    async def heartbeats(self, interval: float) -> None:
        assert self.log is not None
        await asyncio.sleep(random.uniform(0, interval))
        while True:
            t0 = time.perf_counter()
            try:
                await self.log.append(self.heartbeat())
                self.stats.heartbeats += 1
                self.stats.append_seconds.append(time.perf_counter() - t0)
            except Exception:  # noqa: BLE001 - counted; the next heartbeat is the retry
                self.stats.heartbeat_errors += 1
            await asyncio.sleep(max(0.0, interval - (time.perf_counter() - t0)))

    async def commands(self) -> None:
        assert self.log is not None
        consumer = command_consumer(self.creds, self.host_id)
        while self.sub is None:  # the controller provisions the consumer at its start
            try:
                self.sub = await self.log.subscribe(COMMANDS_STREAM, durable=consumer,
                                                    subject_filter=command_subject(self.host_id))
            except Exception:  # noqa: BLE001 - not provisioned yet
                await asyncio.sleep(2.0)
        while True:
            try:
                msg = await self.sub.next(timeout=COMMAND_POLL_SECONDS)
            except Exception:  # noqa: BLE001 - connection trouble: poll again
                await asyncio.sleep(0.5)
                continue
            if msg is None:
                continue
            event = codec.decode(msg.data)
            if isinstance(event, CommandIssued) and event.action_id not in self.done:
                self.done.add(event.action_id)
                self.stats.commands += 1
                asyncio.get_running_loop().create_task(self.execute(event, msg))
            else:
                if isinstance(event, CommandWithdrawn):
                    self.stats.commands += 1
                try:
                    await self.sub.ack(msg)
                except Exception:  # noqa: BLE001 - counted; unacknowledged, it is delivered again
                    self.stats.ack_errors += 1

    async def execute(self, cmd: CommandIssued, msg: object) -> None:
        assert self.log is not None and self.sub is not None
        self.highest_term = max(self.highest_term, cmd.controller_term)
        duration = DURATIONS[cmd.kind] * random.uniform(0.5, 1.5)
        try:
            await self.log.append(accepted_ack(self.host_id, cmd, time.time()))
            self.stats.acks += 1
            self.residencies[cmd.model_id] = self.residency(cmd, RUNNING_STATE[cmd.kind])
            await asyncio.sleep(duration)
            final = FINAL_STATE[cmd.kind]
            if final is None:
                self.residencies.pop(cmd.model_id, None)
            else:
                self.residencies[cmd.model_id] = self.residency(cmd, final)
            receipt = Receipt(action_id=cmd.action_id, kind=cmd.kind, model_id=cmd.model_id, status="succeeded",
                              duration_seconds=duration, generation=cmd.generation,
                              controller_term=cmd.controller_term, finished_at=time.time())
            await self.log.append(terminal_ack(self.host_id, receipt, time.time()))
            self.stats.acks += 1
            await self.sub.ack(msg)  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - counted; redelivery retries the command
            self.stats.ack_errors += 1
            self.done.discard(cmd.action_id)

    def residency(self, cmd: CommandIssued, state: str) -> Residency:
        holds = state != "loading"
        serving = state in ("ready", "draining")
        return Residency(model_id=cmd.model_id, memory_mb=cmd.memory_mb if holds else 0, state=state,  # type: ignore[arg-type]
                         managed=True, runtime=cmd.runtime, artifact_sha256=cmd.artifact_sha256,
                         loaded_age_seconds=0.0 if serving else None, active_requests=0,
                         max_concurrency=cmd.slots if serving else None)


async def run(url: str, hosts_file: Path, stats_file: Path, interval: float) -> None:
    stats = Stats()
    rows = [line.split() for line in hosts_file.read_text().splitlines() if line.strip()]
    hosts = [SimHost(host_id, Path(creds), int(host_id.rsplit("-", 1)[-1]), stats) for host_id, creds in rows]

    async def report() -> None:
        with open(stats_file, "a") as out:
            while True:
                out.write(json.dumps(stats.doc()) + "\n")
                out.flush()
                await asyncio.sleep(1.0)

    reporter = asyncio.create_task(report())
    sem = asyncio.Semaphore(32)

    async def start(h: SimHost) -> None:
        # Until it is in: under load (2,500+ hosts connecting) the servers time connections out,
        # and a host that gave up would be missing from the whole window.
        attempt = 0
        while True:
            async with sem:
                try:
                    await h.connect(url)
                    break
                except Exception as exc:  # noqa: BLE001 - a busy server: try again
                    stats.connect_retries += 1
                    stats.connect_error = f"{type(exc).__name__}: {exc}"[:200]
            attempt += 1
            # Outside the semaphore, so waiting hosts do not hold back the others; spread out.
            await asyncio.sleep(min(CONNECT_RETRY_MAX_SECONDS, 0.5 * 2 ** min(attempt, 6)) * random.uniform(0.5, 1.0))
        asyncio.get_running_loop().create_task(h.heartbeats(interval))
        asyncio.get_running_loop().create_task(h.commands())

    await asyncio.gather(*(start(h) for h in hosts))
    await asyncio.Event().wait()
    reporter.cancel()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("url", help="NATS URL(s), comma-separated")
    ap.add_argument("hosts_file", type=Path, help="lines of `host_id creds_path`")
    ap.add_argument("stats_file", type=Path, help="JSON lines of counters, one a second")
    ap.add_argument("--interval", type=float, default=5.0, help="heartbeat interval, seconds")
    args = ap.parse_args()
    try:
        asyncio.run(run(args.url, args.hosts_file, args.stats_file, args.interval))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
