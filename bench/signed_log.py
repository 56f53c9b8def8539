"""What signed events cost: appends, replay and heartbeat verification, signed vs unsigned.

One nats-server in operator mode (the real file store, sync_interval: always), measured in one
run with interleaved rounds:

- appends/s of a host's heartbeats through JetStreamLog, each signed with the host's key (the
  default for any identity) vs the same appends unsigned, both straight into the stream (goal >=
  0.8);
- replay events/s of the fleet and actions projections through an operator's log: a signed
  window, every message verified, vs an unsigned window of the same heartbeats, not verified
  (goal >= 0.7);
- heartbeat verification in the fold alone (no I/O): microseconds per heartbeat and the CPU share
  of one core that 10,000 hosts heartbeating every 5 s cost, each host with its own credential.

    python -m bench.signed_log [--events 3000] [--window 64] [--rounds 3] [--replay-events 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import msgspec

from bench._common import Timer, heartbeat, secured_grid
from bench.log_ingest import windowed
from grid.events import codec
from grid.events.host import HostHeartbeat
from grid.events.subjects import HOSTS_STREAM, subject_for
from grid.identity.authority import Authority
from grid.identity.connect import connect_log
from grid.identity.permissions import Principal, Role
from grid.identity.signing import Identity, Verifier

HOST = "bench-host"
HEARTBEAT_SECONDS = 5.0


def own_heartbeats(n: int, offset: int) -> list[HostHeartbeat]:
    return [msgspec.structs.replace(heartbeat(i), host_id=HOST, event_id=f"hb-{i}")
            for i in range(offset, offset + n)]


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


async def appends(url: str, creds: Path, writer_creds: Path, events: int, window: int,
                  rounds: int) -> tuple[float, float]:
    """Heartbeat appends/s signed with the host's key vs unsigned, both published straight into
    the stream by a grid-account client (`writer_creds`): the grid's ingress stores a host's own
    appends only when they are signed, so an unsigned baseline cannot take the host's path
    (bench.auth_log measures what the ingress adds)."""
    identity = Identity.from_creds(creds)
    log = await connect_log(url, name="bench-host", credentials=writer_creds, ensure_streams=False)
    signed, unsigned = [], []
    offset = 0
    try:
        for _ in range(rounds):  # interleaved, to cancel drift in disk and CPU state
            for authorship, rates in ((identity, signed), (None, unsigned)):
                chunk = own_heartbeats(events, offset)
                offset += events
                log.authorship = authorship
                with Timer() as t:
                    await windowed(events, window, lambda i: log.append(chunk[i]))
                rates.append(events / t.seconds)
    finally:
        log.authorship = identity
        await log.close()
    return median(signed), median(unsigned)


async def replays(url: str, operator_creds: Path, controller_creds: Path, events: int, hosts: int,
                  rounds: int) -> tuple[float, float, int]:
    """Fold rates of a signed window (verified) and of the same heartbeats unsigned (not)."""
    from grid.projections.runner import ACTIONS, FLEET, ProjectionRunner

    controller = await connect_log(url, name="bench-controller", credentials=controller_creds)
    identity = controller.authorship
    operator = await connect_log(url, name="bench-operator", credentials=operator_creds, ensure_streams=False)
    verifier = operator.authorship
    rates: dict[bool, list[float]] = {True: [], False: []}
    try:
        for round_ in range(rounds):
            for signed in (True, False):
                await controller.client.jetstream().purge_stream(HOSTS_STREAM)
                # The controller may write every host's subjects, so one identity signs them all.
                controller.authorship = identity if signed else None
                for start in range(0, events, 256):
                    # Fresh event ids: the server's duplicate window outlives a purge.
                    # Signed now, each host's newer than its last: the folds refuse a heartbeat
                    # dated ahead of its receipt or behind the host's last one.
                    now = time.time()
                    chunk = [msgspec.structs.replace(heartbeat(i, hosts), event_id=f"hb-{round_}-{signed}-{i}",
                                                     at=now + i * 1e-6)
                             for i in range(start, min(events, start + 256))]
                    await asyncio.gather(*(controller.append(e) for e in chunk))
                operator.authorship = verifier if signed else None
                runner = ProjectionRunner((FLEET, ACTIONS))
                with Timer() as t:
                    folded = await runner.catch_up(operator)
                assert runner.gate.rejected_total == 0, runner.rejected
                rates[signed].append(folded / t.seconds)
    finally:
        controller.authorship, operator.authorship = identity, verifier
        await controller.close()
        await operator.close()
    return median(rates[True]), median(rates[False]), events


def verification_cost(authority: Authority, folder: Path, hosts: int) -> tuple[float, float, int]:
    """(µs per heartbeat with the signer known, µs for a signer seen the first time, header bytes)."""
    identities = [Identity.from_creds(authority.issue_creds(Principal(Role.HOST, host_id=f"host-{i:05d}"),
                                                            folder / f"h{i}.creds", now=time.time(),
                                                            ttl_seconds=3600.0)) for i in range(hosts)]
    messages = []
    for i, identity in enumerate(identities):
        event = heartbeat(i, hosts)
        event = msgspec.structs.replace(event, host_id=f"host-{i:05d}")
        data = codec.encode(event)
        subject = subject_for(event)
        messages.append((subject, data, identity.sign(subject, data)))
    verifier = Verifier(authority.account_public)
    now = time.time()
    with Timer() as first:
        for subject, data, headers in messages:
            assert verifier.verify(subject, data, headers, at=now).ok
    with Timer() as steady:
        for subject, data, headers in messages:
            assert verifier.verify(subject, data, headers, at=now).ok
    header_bytes = sum(len(k) + len(v) for k, v in messages[0][2].items())
    return steady.seconds / hosts * 1e6, first.seconds / hosts * 1e6, header_bytes


async def main(events: int, window: int, rounds: int, replay_events: int, hosts: int, verify_hosts: int) -> None:
    async with secured_grid("grid-bench-signed-", HOST) as grid:
        signed, unsigned = await appends(grid.url, grid.creds[Role.HOST], grid.creds[Role.CONTROLLER], events,
                                         window, rounds)
        print(f"appends/s  signed={signed:,.0f}  unsigned={unsigned:,.0f}  ratio={signed / unsigned:.2f} "
              f"(goal >= 0.8; the host's key, straight into the stream, window={window}, {events} events x {rounds} rounds)")
        fold_signed, fold_unsigned, total = await replays(grid.url, grid.creds[Role.OPERATOR],
                                                          grid.creds[Role.CONTROLLER], replay_events, hosts, rounds)
        print(f"replay events/s  signed+verified={fold_signed:,.0f}  unsigned={fold_unsigned:,.0f}  "
              f"ratio={fold_signed / fold_unsigned:.2f} (goal >= 0.7; fleet+actions projections, {total} heartbeats)")
        steady_us, first_us, header_bytes = verification_cost(grid.authority, grid.directory, verify_hosts)
    per_second = 10_000 / HEARTBEAT_SECONDS
    print(f"heartbeat verification  {steady_us:.1f} µs each (signer known), {first_us:.1f} µs the first time a "
          f"signer is seen ({verify_hosts} host credentials); 10,000 hosts every {HEARTBEAT_SECONDS:.0f} s = "
          f"{per_second:,.0f}/s = {per_second * steady_us / 1e6:.1%} of one core; "
          f"signature headers {header_bytes} bytes per message")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=3000, help="heartbeats appended per round and variant")
    p.add_argument("--window", type=int, default=64, help="appends in flight")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians are printed)")
    p.add_argument("--replay-events", type=int, default=20000, help="heartbeats in the replayed window")
    p.add_argument("--hosts", type=int, default=256, help="distinct hosts in the replayed window")
    p.add_argument("--verify-hosts", type=int, default=2000, help="host credentials in the verification run")
    a = p.parse_args()
    asyncio.run(main(a.events, a.window, a.rounds, a.replay_events, a.hosts, a.verify_hosts))
