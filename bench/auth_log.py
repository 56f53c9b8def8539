"""Append and replay through JetStreamLog vs raw nats-py, both on the same authenticated server.

One nats-server in operator mode (accounts, user JWTs with the permission table's allow/deny
lists, file store with sync_interval: always). Appends: a host credential appending its own
heartbeats, JetStreamLog.append vs js.publish of the same bytes with the same Nats-Msg-Id and
signature, the same window in flight, interleaved rounds; both go through the grid's ingress (a
controller relaying, budgets opened wide), and a second line compares that with the same signed
heartbeats published straight into the stream by a grid-account client (the path before it).
Replay: an operator credential folding the fleet and actions projections through JetStreamLog
(batched direct gets from its own account) vs a raw ordered consumer reading every message (as
the controller: no other role may create one), and vs the same fold through ordered consumers. Also
prints raw appends on an unauthenticated server, to show what the permission checks cost.

    python -m bench.auth_log [--events 3000] [--window 64] [--rounds 3] [--replay-events 30000]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import msgspec
import nats

from bench._common import Timer, embedded_server, heartbeat, secured_grid
from bench.log_ingest import windowed
from bench.log_replay import raw_ordered
from grid.events import codec
from grid.events.host import HostHeartbeat
from grid.events.subjects import HOSTS_STREAM, subject_for
from grid.identity.creds import connect_options
from grid.identity.permissions import Role
from grid.identity.connect import connect_log

HOST = "bench-host"


def own_heartbeats(n: int, offset: int) -> list[HostHeartbeat]:
    return [msgspec.structs.replace(heartbeat(i), host_id=HOST, event_id=f"hb-{i}")
            for i in range(offset, offset + n)]


async def appends(url: str, creds: Path | None, events: int, window: int, rounds: int) -> tuple[float, float]:
    log = await connect_log(url, name="bench-host", credentials=creds, ensure_streams=False)
    sign = log.authorship.sign if log.authorship is not None else None
    raw = await nats.connect(url, **connect_options(creds, None))
    js = raw.jetstream()
    ours, theirs = [], []
    offset = 0
    try:
        for _ in range(rounds):  # interleaved, to cancel drift in disk and CPU state
            chunk = own_heartbeats(events, offset)
            offset += events
            with Timer() as t:
                await windowed(events, window, lambda i: log.append(chunk[i]))
            ours.append(events / t.seconds)
            # Signed like JetStreamLog's (the ingress stores only signed host events), made first.
            payloads = [(subject_for(e), data, {"Nats-Msg-Id": e.event_id,
                                                **(sign(subject_for(e), data) if sign else {})})
                        for e in own_heartbeats(events, offset) for data in [codec.encode(e)]]
            offset += events
            with Timer() as t:
                await windowed(events, window, lambda i: js.publish(payloads[i][0], payloads[i][1],
                                                                    headers=payloads[i][2]))
            theirs.append(events / t.seconds)
    finally:
        await log.close()
        await raw.close()
    return sorted(ours)[len(ours) // 2], sorted(theirs)[len(theirs) // 2]


async def through_ingress(url: str, host_creds: Path, controller_creds: Path, events: int, window: int,
                          rounds: int) -> tuple[float, float]:
    """Median appends/s of a host's signed heartbeats through the grid's ingress (its own account,
    a controller relaying) vs the same signed events published straight into the stream by a
    client of the grid's account (the path before the ingress), rounds interleaved."""
    host = await connect_log(url, name="bench-host", credentials=host_creds, ensure_streams=False)
    direct = await connect_log(url, name="bench-direct", credentials=controller_creds, ensure_streams=False)
    direct.authorship = host.authorship  # the host's own signatures, on the host's own subject
    relayed, straight = [], []
    offset = 10_000_000  # ids of their own: the stream's duplicate window outlives a round
    try:
        for _ in range(rounds):
            for log_, rates in ((host, relayed), (direct, straight)):
                chunk = own_heartbeats(events, offset)
                offset += events
                with Timer() as t:
                    await windowed(events, window, lambda i: log_.append(chunk[i]))
                rates.append(events / t.seconds)
    finally:
        await host.close()
        await direct.close()
    return sorted(relayed)[len(relayed) // 2], sorted(straight)[len(straight) // 2]


async def replays(url: str, creds: Path, controller_creds: Path, events: int, hosts: int,
                  rounds: int) -> tuple[float, float, float, int]:
    from grid.projections.runner import ACTIONS, FLEET, ProjectionRunner

    controller = await connect_log(url, name="bench-controller", credentials=controller_creds)
    js = controller.client.jetstream()
    await js.purge_stream(HOSTS_STREAM)  # only the replay window's heartbeats, not the appends'
    for start in range(0, events, 256):
        # Signed as the controller (it may write every host's subjects), so the fold verifies
        # and keeps them. Fresh event ids: the duplicate window outlives the purge.
        # Dated now, each host's newer than its last: the folds refuse a heartbeat dated ahead of
        # its receipt or behind the host's last one.
        now = time.time()
        chunk = [msgspec.structs.replace(heartbeat(i, hosts), event_id=f"replay-{i}", at=now + i * 1e-6)
                 for i in range(start, min(events, start + 256))]
        await asyncio.gather(*(controller.append(e) for e in chunk))
    total = (await js.stream_info(HOSTS_STREAM)).state.messages
    operator = await connect_log(url, name="bench-operator", credentials=creds, ensure_streams=False)
    raw_rates, fold_rates, consumer_fold_rates = [], [], []
    try:
        for _ in range(rounds):
            # Only the controller may create a consumer (grid.identity.permissions): the raw
            # ordered consumer, and the same fold through consumers, read as the controller.
            with Timer() as t:
                n = await raw_ordered(controller, HOSTS_STREAM, "grid.host.>", total)
            raw_rates.append(n / t.seconds)
            for log_, rates in ((operator, fold_rates), (controller, consumer_fold_rates)):
                runner = ProjectionRunner((FLEET, ACTIONS), strict=True)
                with Timer() as t:
                    folded = await runner.catch_up(log_)
                rates.append(folded / t.seconds)
    finally:
        await operator.close()
        await controller.close()
    return max(fold_rates), max(consumer_fold_rates), max(raw_rates), total


async def main(events: int, window: int, rounds: int, replay_events: int, hosts: int) -> None:
    async with secured_grid("grid-bench-auth-", HOST) as grid:
        creds = grid.creds
        ours, raw = await appends(grid.url, creds[Role.HOST], events, window, rounds)
        print(f"authenticated appends/s  JetStreamLog={ours:,.0f}  raw nats-py={raw:,.0f}  "
              f"ratio={ours / raw:.2f} (goal >= 0.8; host credential, window={window}, "
              f"{events} events x {rounds} rounds)")
        relayed, straight = await through_ingress(grid.url, creds[Role.HOST], creds[Role.CONTROLLER], events, window,
                                                  rounds)
        print(f"host appends/s through the ingress={relayed:,.0f}  straight into the stream={straight:,.0f}  "
              f"ratio={relayed / straight:.2f} (the ingress's cost per append; its budgets opened wide)")
        fold, consumer_fold, raw_replay, total = await replays(grid.url, creds[Role.OPERATOR], creds[Role.CONTROLLER],
                                                               replay_events, hosts, rounds)
        print(f"authenticated replay events/s  fleet projection={fold:,.0f}  raw ordered={raw_replay:,.0f}  "
              f"ratio={fold / raw_replay:.2f} (goal >= 0.7; operator credential, {total} heartbeats)")
        print(f"fleet projection events/s  by direct gets (operator)={fold:,.0f}  by an ordered consumer "
              f"(controller)={consumer_fold:,.0f}  ratio={fold / consumer_fold:.2f}")
    with embedded_server() as plain:
        await (await connect_log(plain.url)).close()
        _, raw_plain = await appends(plain.url, None, events, window, rounds)
    print(f"raw nats-py appends/s without auth={raw_plain:,.0f}  with auth={raw:,.0f}  "
          f"(auth cost ratio={raw / raw_plain:.2f})")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--events", type=int, default=3000)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--replay-events", type=int, default=30000)
    p.add_argument("--hosts", type=int, default=256)
    a = p.parse_args()
    asyncio.run(main(a.events, a.window, a.rounds, a.replay_events, a.hosts))
