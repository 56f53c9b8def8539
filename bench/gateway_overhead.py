"""Gateway overhead: the same real llama-server, called directly and through the gateway, on
the path a user gets by default.

One run (bench._common.one_host_grid) starts a real nats-server, one llama-server child
(SmolLM2-135M Q4_1) with a random engine key only its host knows, the host agent's side of
inference as its own process (an `InferenceResponder` that adds that key, as grid.agent does),
live heartbeats describing the engine, and the gateway as its own process
(`python -m grid.cli.main serve gateway`, default upstream backend `nats`, no engine key). The
gateway path is therefore gateway -> NATS -> host agent -> engine. Rounds are interleaved
(direct/gateway order alternates each round) with one keep-alive httpx client per path:

  * sequential non-streaming chat, max_tokens=1 (end-to-end latency)
  * sequential streaming chat, time to the first content token

It prints median and p99 for both paths, the added milliseconds (gateway - direct) and the
ratio gateway/direct, and the gateway process's CPU time per proxied request (user + system,
over the measured rounds), with the host agent's and nats-server's beside it (the rest of the
added path; bench.remote_overhead is the same run seen from the remote host). On a shared
machine the latency figures move by milliseconds with the load, the CPU figure much less.
Goal: median added <= 2 ms.

No `--upstream h1|httpx` any more: those gateway backends only reach engines that take no key,
and no engine a Grid agent starts is one (each runs with its host's own key, which the gateway
never holds), so comparing them would time a path no user's request takes. The agent's own
engine hop uses grid.gateway.h1's pool (grid.agent.engine_client), and is in every figure here.

    python -m bench.gateway_overhead [--rounds 200] [--threads 1]
"""

from __future__ import annotations

import asyncio
import importlib.util
import os

import httpx

from bench._common import overhead_args, overhead_rounds, print_latency_table


async def run(rounds: int, threads: int, warmup: int) -> None:
    async with overhead_rounds("gateway", rounds=rounds, threads=threads, warmup=warmup) as (grid, results, cpu_ms):
        async with httpx.AsyncClient(trust_env=False, timeout=10.0) as c:
            stats = (await c.get(f"{grid.gateway_url}/gateway/stats")).json()

    parser_name = "httptools" if importlib.util.find_spec("httptools") else "h11"
    print(f"gateway overhead: {rounds} interleaved rounds, llama-server threads={threads}, "
          f"SmolLM2-135M Q4_1, gateway in its own process (uvicorn {parser_name}), upstream nats via the "
          f"host agent (own process), load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus")
    added = print_latency_table(results, "direct", "gateway")
    print(f"gateway process CPU per proxied request: {cpu_ms['gateway']:.3f} ms (user + system over "
          f"{2 * rounds} requests); rest of the added path: host agent {cpu_ms['host agent']:.3f} ms, "
          f"nats-server {cpu_ms['nats-server']:.3f} ms")
    tel = stats["telemetry"]
    print(f"telemetry: accepted={tel['accepted']} flushed={tel['flushed_records']} dropped={tel['dropped']}")
    print(f"goal median added <= 2 ms: {'met' if added <= 2.0 else 'NOT met'} ({added:.2f} ms)")


def main() -> None:
    args = overhead_args(__doc__)
    asyncio.run(run(args.rounds, args.threads, args.warmup))


if __name__ == "__main__":
    main()
