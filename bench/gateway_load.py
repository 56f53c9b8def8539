"""Gateway under load: a bounded number of concurrent clients, the real gateway, one real llama-server.

One run (bench._common.one_host_grid) starts a real nats-server, one llama-server child
(SmolLM2-135M Q4_1, --slots N) with a random engine key only its host knows, the host agent's
side of inference as its own process (an `InferenceResponder` that adds that key, as grid.agent
does), live heartbeats describing the engine, and the gateway as its own process
(`python -m grid.cli.main serve gateway`, default upstream backend `nats`, no engine key): what
a user gets by default, gateway -> NATS -> host agent -> engine. Three scenarios, each with
`--clients` concurrent clients (one keep-alive httpx client each) sending short non-streaming
chats until `--requests` have been sent or `--seconds` have passed:

  * direct: straight to llama-server (the baseline)
  * gateway: through the gateway, no affinity key
  * gateway+affinity: through the gateway with X-Grid-Affinity-Key (16 distinct keys)

For each it prints throughput, p50/p99 latency, the outcome counts (200; 429/503, which are the
gateway's honest answers under overload; anything else is a failure: goal none), and CPU per
request: the gateway process's own, against the bench client's when it calls llama-server
directly (what one Python HTTP hop costs here), with the ratio; the host agent's and
nats-server's (the rest of the added path) are printed beside it. Loopback only.

    python -m bench.gateway_load [--clients 8] [--requests 200] [--seconds 60] [--slots 2]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import time
from typing import Any

import httpx
import psutil

from bench._common import MESSAGES, MODEL_ID, cpu_seconds, one_host_grid, pct

AFFINITY_KEYS = 16
SHED = (429, 503)
ADDED = ("gateway", "host agent", "nats-server")  # the processes only the gateway path uses


class Outcome:
    def __init__(self) -> None:
        self.latencies: list[float] = []  # successful requests only
        self.statuses: collections.Counter[str] = collections.Counter()
        self.wall = 0.0
        self.cpu: dict[str, float] = {}  # seconds per process over the scenario

    @property
    def sent(self) -> int:
        return sum(self.statuses.values())

    @property
    def failures(self) -> int:
        return sum(n for status, n in self.statuses.items() if status not in ("200", *map(str, SHED)))


async def scenario(url: str, headers: dict[str, str], *, clients: int, requests: int, seconds: float,
                   affinity: bool, procs: dict[str, psutil.Process]) -> Outcome:
    out = Outcome()
    body = {"model": MODEL_ID, "messages": MESSAGES, "max_tokens": 4, "temperature": 0}
    issued = 0
    deadline = time.monotonic() + seconds

    async def client(worker: int) -> None:
        nonlocal issued
        async with httpx.AsyncClient(trust_env=False, timeout=60.0) as c:
            while issued < requests and time.monotonic() < deadline:
                n = issued
                issued += 1
                h = dict(headers)
                if affinity:
                    h["X-Grid-Affinity-Key"] = f"conversation-{n % AFFINITY_KEYS}"
                t0 = time.perf_counter()
                try:
                    r = await c.post(url, json=body, headers=h)
                    status = str(r.status_code)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                if status == "200":
                    out.latencies.append(time.perf_counter() - t0)
                out.statuses[status] += 1

    before = {name: cpu_seconds(p) for name, p in procs.items()}
    t0 = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    out.wall = time.perf_counter() - t0
    out.cpu = {name: cpu_seconds(p) - before[name] for name, p in procs.items()}
    return out


async def run(clients: int, requests: int, seconds: float, slots: int, threads: int) -> None:
    async with one_host_grid(threads=threads, slots=slots, context_size=512 * slots) as grid:
        procs = {"client": psutil.Process(), **grid.procs}
        direct_procs = {n: p for n, p in procs.items() if n not in ADDED}
        common: dict[str, Any] = {"clients": clients, "seconds": seconds}
        # Warm both paths (connections, llama.cpp's prompt cache) outside the measurement.
        await scenario(*grid.direct, requests=2 * clients, affinity=False, procs=direct_procs, **common)
        await scenario(*grid.via, requests=2 * clients, affinity=False, procs=procs, **common)
        results = {
            "direct": await scenario(*grid.direct, requests=requests, affinity=False, procs=direct_procs, **common),
            "gateway": await scenario(*grid.via, requests=requests, affinity=False, procs=procs, **common),
            "gateway+affinity": await scenario(*grid.via, requests=requests, affinity=True, procs=procs, **common),
        }

    load = os.getloadavg()[0]
    print(f"gateway load: {clients} concurrent clients, <= {requests} requests or {seconds:.0f} s per "
          f"scenario, llama-server slots={slots} threads={threads}, SmolLM2-135M Q4_1, max_tokens=4, "
          f"gateway and host agent in their own processes (upstream nats), load average {load:.2f} on "
          f"{os.cpu_count()} cpus")
    print(f"{'scenario':<18}{'sent':>6}{'req/s':>8}{'p50 ms':>9}{'p99 ms':>9}{'200':>6}{'429/503':>9}"
          f"{'failed':>8}{'gw cpu ms/req':>15}{'engine cpu ms/req':>19}")
    for name, o in results.items():
        ok = o.statuses.get("200", 0)
        shed = sum(o.statuses.get(str(s), 0) for s in SHED)
        per = 1e3 / max(1, o.sent)
        gw = f"{o.cpu['gateway'] * per:.2f}" if name != "direct" else "-"
        print(f"{name:<18}{o.sent:>6}{ok / o.wall:>8.1f}{pct(o.latencies, 0.5) * 1e3:>9.1f}"
              f"{pct(o.latencies, 0.99) * 1e3:>9.1f}{ok:>6}{shed:>9}{o.failures:>8}{gw:>15}"
              f"{o.cpu['engine'] * per:>19.2f}")
        other = {s: n for s, n in o.statuses.items() if s not in ("200", *map(str, SHED))}
        if other:
            print(f"  failures: {dict(sorted(other.items()))}")
    d = results["direct"]
    client_per = d.cpu["client"] * 1e3 / max(1, d.sent)
    print(f"direct client cpu ms/req (one Python httpx hop): {client_per:.2f}")
    for name in ("gateway", "gateway+affinity"):
        o = results[name]
        gw_per = o.cpu["gateway"] * 1e3 / max(1, o.sent)
        print(f"{name}: gateway cpu/req {gw_per:.2f} ms = {gw_per / client_per:.2f}x the direct client's "
              f"(host agent {o.cpu['host agent'] * 1e3 / max(1, o.sent):.2f} ms, nats-server "
              f"{o.cpu['nats-server'] * 1e3 / max(1, o.sent):.2f} ms); throughput "
              f"{o.statuses.get('200', 0) / o.wall / max(1e-9, d.statuses.get('200', 0) / d.wall):.3f}x direct")
    failed = sum(o.failures for o in results.values())
    print(f"goal no failures other than 429/503: {'met' if failed == 0 else 'NOT met'} ({failed})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (bounded)")
    parser.add_argument("--requests", type=int, default=200, help="requests per scenario (upper bound)")
    parser.add_argument("--seconds", type=float, default=60.0, help="time per scenario (upper bound)")
    parser.add_argument("--slots", type=int, default=2, help="llama-server parallel slots (max_concurrency)")
    parser.add_argument("--threads", type=int, default=1, help="llama-server threads (2 cores here)")
    args = parser.parse_args()
    asyncio.run(run(max(1, args.clients), max(1, args.requests), max(1.0, args.seconds), max(1, args.slots),
                    args.threads))


if __name__ == "__main__":
    main()
