"""Remote-host overhead: an engine called directly on its host, and through the gateway and
that host's agent over NATS (grid.infer), the path every request takes in a fleet.

One run starts a real nats-server, one llama-server child (SmolLM2-135M Q4_1) with a random
engine key only the "host" knows, the host's agent side of inference as its own process (an
`InferenceResponder` with the agent's engine client, on its own NATS connection, as on another
machine), and the gateway as its own process (`gridctl serve gateway`, which holds no engine
key), all set up by bench._common.one_host_grid. Everything is on loopback: the added latency
is the gateway's work plus two NATS hops and the agent's forward; on a real network each hop
also adds its round trip.

Rounds are interleaved (direct/remote order alternates each round), one keep-alive client per
path:
  * sequential non-streaming chat, max_tokens=1 (end-to-end latency)
  * sequential streaming chat, time to the first content token
It prints median and p99 of both, the added milliseconds and the ratio, and the CPU time per
remote request of each process on the added path (gateway, nats-server, host agent; user +
system over the measured rounds, of which the direct calls use none): on a shared 2-core
machine the latency moves by milliseconds with the load, the CPU figures much less. Goal:
median added <= 2 ms.

    python -m bench.remote_overhead [--rounds 200] [--threads 1]
"""

from __future__ import annotations

import asyncio
import os

import httpx

from bench._common import MODEL_ID, overhead_args, overhead_rounds, print_latency_table


async def run(rounds: int, threads: int, warmup: int) -> None:
    async with overhead_rounds("remote", rounds=rounds, threads=threads, warmup=warmup) as (grid, results, cpu_ms):
        async with httpx.AsyncClient(trust_env=False, timeout=60.0) as c:
            r = await c.post(grid.via[0], json={"model": MODEL_ID, "max_tokens": 1,
                                                 "messages": [{"role": "user", "content": "x"}]})
            served_by = r.headers.get("x-grid-host")

    print(f"remote-host overhead: {rounds} interleaved rounds, llama-server threads={threads}, "
          f"SmolLM2-135M Q4_1; gateway and host agent in their own processes over one nats-server, "
          f"loopback; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus; "
          f"served by X-Grid-Host={served_by}")
    added = print_latency_table(results, "direct", "remote")
    print("CPU per remote request: " + ", ".join(f"{n} {ms:.3f} ms" for n, ms in cpu_ms.items())
          + f" (total {sum(cpu_ms.values()):.3f} ms)")
    print(f"goal median added <= 2 ms: {'met' if added <= 2.0 else 'NOT met'} ({added:.2f} ms)")


def main() -> None:
    args = overhead_args(__doc__)
    asyncio.run(run(args.rounds, args.threads, args.warmup))


if __name__ == "__main__":
    main()
