"""The fold-level probe of bench.hostile_flood (`python -m bench.hostile_flood --fold ...`): what
one hostile host's flood costs an honest host's heartbeat's age inside an in-process fold.

A nats-server in operator mode, an honest host heartbeating every `--interval` seconds through its
own credential, and the controller's projections (grid.controller.tick.PROJECTIONS) following
the log live as the controller's identity. Measured in one run, each phase with a fresh fold:

- quiet: no flood (the baseline);
- flood: from its own process (bench._flooder), valid signed heartbeats (or `--mode junk`,
  unsigned bytes) on a second host's subject as fast as one client can for `--seconds`: the fold
  drops them over that host's budget (grid.projections.budget). A host's own appends go through
  the grid's ingress, which refuses all but its small budget before they reach the stream
  (grid.controller.ingress; bench.hostile_flood measures that), so the flood here is published
  straight into the stream with a grid-account credential: this probes the folds' second line,
  for whatever lands on a host subject another way. The honest host appends through the ingress;
- flood, budgets off: the same flood into a fold that verifies, decodes and folds every message
  (what the controller and gateway did before issue 36).

For each: the honest heartbeat's largest age in the fold (receipt time to now, sampled every
50 ms), what the server stored of the flood, how long after the flood the fold reached the end of
the stream, and what was dropped. The ratio is quiet age / flood age (goal >= 0.5: a flood never
makes an honest host look more than one interval older; the issue's goal is 2 heartbeat intervals).

`--window N` keeps N of the flooder's publishes awaiting the stream's ack (as fast as the log
stores them); `--window 0` fires and forgets. With fsync on every write (`--fsync`, the embedded
server's default) this machine's disk stores some 5,000 messages a second, well below what one
client sends: the server itself then queues (and past its ingest limit drops) everyone's
messages, honest heartbeats included, before any reader sees them; by default the bench runs the
server without fsync so the readers, not the disk, are what it measures.

    python -m bench.hostile_flood --fold [--seconds 4] [--interval 1] [--mode signed|junk] [--window 256] [--fsync]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from bench._common import REPO
from grid.controller.ingress import HostIngress
from grid.controller.tick import PROJECTIONS
from grid.events.base import new_event_id
from grid.events.host import HostHeartbeat, HostResources
from grid.events.log import LogError
from grid.events.subjects import HOSTS_STREAM, host_subject
from grid.identity.authority import Authority
from grid.identity.connect import connect_log
from grid.identity.permissions import Principal, Role
from grid.identity.server import SecuredEmbeddedNats
from grid.projections.runner import ProjectionRunner

HONEST = "honest-host"
FLOODER = "flooder-host"


class Phase(msgspec.Struct):
    name: str
    max_age: float
    sent: int = 0
    stored: int = 0
    stored_per_second: float = 0.0
    catch_up_seconds: float = 0.0
    dropped: dict[str, int] = {}
    honest_failed: int = 0


async def _phase(name: str, url: str, creds: dict[str, Path], *, flood: bool, budget: bool, seconds: float,
                 interval: float, mode: str, window: int) -> Phase:
    controller = await connect_log(url, name="bench-controller", credentials=creds["controller"])
    honest = await connect_log(url, name="bench-honest", credentials=creds["honest"], ensure_streams=False)
    ingress = HostIngress()  # the honest host's appends are stored through it
    await ingress.start(controller.client)
    runner = ProjectionRunner(PROJECTIONS, budget=budget)
    runner.positions[HOSTS_STREAM] = await controller.last_sequence(HOSTS_STREAM)
    follower = asyncio.create_task(runner.follow(controller))
    failed = 0
    stop = asyncio.Event()

    async def beat() -> None:
        nonlocal failed
        ev = HostHeartbeat(event_id=new_event_id(), at=time.time(), host_id=HONEST,
                           resources=HostResources(capacity_mb=16_384))
        try:
            await honest.append(ev)
        except LogError:
            failed += 1

    async def heartbeats() -> None:
        tasks: set[asyncio.Task[None]] = set()
        next_at = time.monotonic()
        while not stop.is_set():
            t = asyncio.create_task(beat())
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            next_at += interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, next_at - time.monotonic()))
        await asyncio.gather(*tasks)

    def age() -> float:
        record = runner["fleet"].hosts.get(HONEST)
        return float("inf") if record is None or record.heartbeat_at is None else time.time() - record.heartbeat_at

    beating = asyncio.create_task(heartbeats())
    out = Phase(name=name, max_age=0.0)
    try:
        deadline = time.monotonic() + 10
        while age() > interval:
            if time.monotonic() > deadline:
                raise RuntimeError("the honest host never showed up in the fold")
            await asyncio.sleep(0.05)
        start_seq = await controller.last_sequence(HOSTS_STREAM)
        if flood:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bench._flooder", url, str(creds["controller"]), host_subject(FLOODER, "heartbeat"),
                str(seconds), mode, FLOODER, str(window), cwd=REPO, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
            waiter = asyncio.create_task(proc.communicate())
            while not waiter.done():
                out.max_age = max(out.max_age, age())
                await asyncio.sleep(0.05)
            stdout, stderr = waiter.result()
            if proc.returncode:
                raise RuntimeError(stderr.decode()[-2000:])
            out.sent = int(msgspec.json.decode(stdout.strip().splitlines()[-1], type=dict[str, Any])["sent"])
        else:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                out.max_age = max(out.max_age, age())
                await asyncio.sleep(0.05)
        flood_end = time.monotonic()
        last, stored_at = -1, 0.0
        while True:
            now_last = await controller.last_sequence(HOSTS_STREAM)
            if now_last != last:
                last, stored_at = now_last, time.monotonic()
            out.max_age = max(out.max_age, age())
            if runner.positions.get(HOSTS_STREAM, 0) >= last and time.monotonic() - stored_at > 0.5:
                break
            if time.monotonic() - flood_end > 300:
                raise RuntimeError("the fold did not catch up within 300 s")
            await asyncio.sleep(0.05)
        out.catch_up_seconds = max(0.0, time.monotonic() - 0.5 - flood_end)
        for _ in range(int(2 * interval / 0.05)):
            out.max_age = max(out.max_age, age())
            await asyncio.sleep(0.05)
        out.stored = last - start_seq
        out.stored_per_second = out.stored / max(stored_at - (flood_end - seconds), 1e-9) if flood else 0.0
        out.dropped = dict(runner.rejected)
        out.honest_failed = failed
    finally:
        stop.set()
        await beating
        follower.cancel()
        with contextlib.suppress(BaseException):
            await follower
        await honest.close()
        await ingress.stop()
        await controller.close()
    return out


async def _admit(url: str, authority: Authority, host_ids: tuple[str, ...]) -> None:
    """Hand the server the hosts' account claims where each host has an account of its own (a
    server that does not know a credential's account admits none of its users); nothing to do
    where every identity shares the grid's account."""
    if not hasattr(authority, "admission_updates"):
        return
    import nats

    from grid.identity import authority as authority_module
    from grid.identity.creds import connect_options

    now = time.time()
    nc = await nats.connect(url, **connect_options(authority.system_creds(now=now), None))
    try:
        updates = authority.admission_updates(list(host_ids), now=now)  # type: ignore[attr-defined]
        await authority_module.push_account_jwts(nc, updates)  # type: ignore[attr-defined]
    finally:
        await nc.close()


async def main(seconds: float, interval: float, mode: str, window: int, fsync: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="grid-bench-flood-") as d:
        directory = Path(d)
        authority = Authority(directory / "identity")
        now = time.time()
        creds: dict[str, Any] = {
            "controller": authority.issue_creds(Principal(Role.CONTROLLER), directory / "c.creds", now=now,
                                                ttl_seconds=3600.0),
            "honest": authority.issue_creds(authority.host_principal(HONEST), directory / "h.creds", now=now,
                                            ttl_seconds=3600.0),
        }
        server = SecuredEmbeddedNats(directory / "nats", authority, sync_always=fsync)
        server.start()
        await _admit(server.url, authority, (HONEST,))
        try:
            await (await connect_log(server.url, credentials=creds["controller"])).close()
            common = dict(seconds=seconds, interval=interval, mode=mode, window=window)
            quiet = await _phase("quiet", server.url, creds, flood=False, budget=True, **common)  # type: ignore[arg-type]
            flooded = await _phase("flood", server.url, creds, flood=True, budget=True, **common)  # type: ignore[arg-type]
            unbounded = await _phase("flood, budgets off", server.url, creds, flood=True, budget=False,
                                     **common)  # type: ignore[arg-type]
        finally:
            server.stop()
    print(f"server: operator mode, fsync {'on every write' if fsync else 'off'}; flood: {mode} heartbeats on one "
          f"subject for {seconds:g} s, {'fire and forget' if window == 0 else f'{window} publishes awaiting acks'}; "
          f"honest heartbeat every {interval:g} s")
    for p in (quiet, flooded, unbounded):
        print(f"  {p.name:<20} honest age max {p.max_age:6.2f} s   flood sent {p.sent:>7,} stored {p.stored:>7,} "
              f"({p.stored_per_second:,.0f}/s)   fold done {p.catch_up_seconds:5.2f} s after   dropped {p.dropped}   "
              f"honest appends failed {p.honest_failed}")
    print(f"honest heartbeat age under a flood: ratio quiet/flood={quiet.max_age / flooded.max_age:.2f} (goal >= 0.5), "
          f"budgets off: {quiet.max_age / unbounded.max_age:.2f}")


def fold_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.hostile_flood --fold", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=4.0, help="how long the flood (and the quiet phase) lasts")
    p.add_argument("--interval", type=float, default=1.0, help="the honest host's heartbeat interval")
    p.add_argument("--mode", choices=("signed", "junk"), default="signed")
    p.add_argument("--window", type=int, default=256, help="flooder publishes awaiting acks (0: fire and forget)")
    p.add_argument("--fsync", action="store_true", help="fsync every write, as the embedded server does by default")
    a = p.parse_args(argv)
    asyncio.run(main(a.seconds, a.interval, a.mode, a.window, a.fsync))


if __name__ == "__main__":
    fold_main(sys.argv[1:])
