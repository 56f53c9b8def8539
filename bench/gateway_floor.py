"""The gateway's floor: how much of the added latency is the gateway itself, and how much the
hop to the engine's host (agent + NATS) adds on top.

One run (bench._common.one_host_grid(floor=True)) starts a real nats-server, one llama-server
child (SmolLM2-135M Q4_1, the runtime an agent would use) with its host's key, the host agent's
side of inference as its own process, and two gateway processes beside each other:

  * gateway: the default path a user gets, gateway -> NATS -> host agent -> engine;
  * floor: a gateway calling the same engine straight over HTTP (upstream backend h1: no agent,
    no NATS, no TLS), adding the engine's key itself as the agent would
    (bench._common.KeyedEngineHop). No user's request takes it: a user's gateway never holds
    an engine key. It is the least a gateway in front of an engine can add on this machine,
    whatever carries the hop behind it.

Rounds are interleaved over the three paths (the order turns each round), one keep-alive client
per path, as bench.gateway_overhead: sequential non-streaming chat (max_tokens=1) and a
stream's time to first token. It prints both paths against the direct call, then the hop's own
share (gateway - floor). Goal of the hop to another machine (issue "The data path"): <= 1.2 ms
beyond this floor, measured in the same run (bench.remote_overhead measures both).

    python -m bench.gateway_floor [--rounds 200] [--threads 1]
"""

from __future__ import annotations

import asyncio
import os

from bench._common import CpuMeter, interleaved, one_host_grid, overhead_args, pct, print_latency_table


async def run(rounds: int, threads: int, warmup: int, idle_seconds: float) -> None:
    async with one_host_grid(threads=threads, floor=True) as grid:
        procs = {n: p for n, p in grid.procs.items() if n != "engine"}
        meter = CpuMeter(procs, idle_seconds)
        results, _ = await interleaved({"direct": grid.direct, "floor": grid.floor, "gateway": grid.via},
                                       rounds=rounds, warmup=warmup, procs=procs, meter=meter)
    print(f"gateway floor: {rounds} interleaved rounds over 3 paths, llama-server threads={threads}, "
          f"SmolLM2-135M Q4_1, loopback, load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus")
    print("floor = a gateway calling the engine straight over HTTP with its key (no agent, no NATS)")
    floor_added = print_latency_table(results, "direct", "floor")
    print("gateway = the default path (gateway -> NATS -> host agent -> engine)")
    added = print_latency_table(results, "direct", "gateway")
    for name, label in (("plain", "max_tokens=1 latency"), ("ttft", "stream first token")):
        hop = (pct(results[name]["gateway"], 0.5) - pct(results[name]["floor"], 0.5)) * 1e3
        print(f"{label}: the hop through NATS and the host agent adds {hop:.2f} ms (median gateway - floor)")
    print(f"CPU per request, net of each process's idle rate (gross, background included): gateway path "
          f"{meter.line(('gateway', 'nats-server', 'host agent'))}; floor path {meter.line(('floor gateway',))}")
    print(meter.idle_line())
    print(f"median added: floor {floor_added:.2f} ms, gateway {added:.2f} ms; the hop beyond the floor "
          f"{added - floor_added:.2f} ms here (goal for a hop to another machine: <= 1.2 ms beyond the floor, "
          f"bench.remote_overhead)")


def main() -> None:
    args = overhead_args(__doc__)
    asyncio.run(run(args.rounds, args.threads, args.warmup, args.idle_seconds))


if __name__ == "__main__":
    main()
