"""Remote-host overhead: an engine called directly from its own host, against the same engine
reached through the gateway from another network namespace (the logical fleet's --netns).

One run starts `gridctl test start --machines 1 --netns` in a temporary grid home: a secured
nats-server (TLS) on the fleet bridge, the controller, the gateway on the root namespace's
loopback, and one real host agent that joined by invitation and runs in its own namespace with
a real llama-server child (SmolLM2-135M Q4_1) bound to that namespace's loopback. The gateway
cannot reach the engine; every request goes gateway -> NATS (over the bridge) -> the host's
agent -> its engine, the path of a machine behind NAT.

The direct path is measured inside the host's namespace by a helper process (`direct-client`)
that calls the engine with the host's own engine key, timing each request itself; the bench
asks it for one request at a time, so rounds stay interleaved (direct/remote order alternates
each round), one keep-alive client per path:
  * sequential non-streaming chat, max_tokens=1 (end-to-end latency)
  * sequential streaming chat, time to the first content token
It prints median and p99 of both, the added milliseconds and the ratio, the median and p90 of
the per-round difference (both paths measured back to back: steadier on a shared machine), and
the CPU time per remote request of each process on the added path (gateway, nats-server, host
agent). Goal: median added <= 2 ms. Needs root (network namespaces).

    python -m bench.remote_overhead [--rounds 200] [--threads 1]
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from bench._common import MESSAGES, cpu_seconds, one_plain, one_ttft, overhead_args, pct, print_latency_table


async def direct_client(url: str, model: str, key_file: Path) -> None:
    """Inside the host's namespace: for each line "plain" or "ttft" on stdin, one direct
    request to the engine with the host's key; its latency in seconds on stdout."""
    key = key_file.read_text().strip()
    headers = {"Authorization": f"Bearer {key}"}
    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient(trust_env=False, timeout=60.0) as client:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            measure = one_plain if line.strip() == "plain" else one_ttft
            print(f"{await measure(client, url, headers, model):.9f}", flush=True)


class DirectPath:
    """The helper process in the host's namespace, asked for one measured request at a time."""

    def __init__(self, namespace: str, url: str, model: str, key_file: Path) -> None:
        repo = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", namespace, sys.executable, "-m", "bench.remote_overhead", "direct-client",
             url, model, str(key_file)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    async def measure(self, kind: str) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(kind + "\n")
        self.proc.stdin.flush()
        line = await asyncio.get_running_loop().run_in_executor(None, self.proc.stdout.readline)
        if not line:
            raise RuntimeError("the direct client in the host's namespace exited")
        return float(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _seed(root: Path) -> None:
    """The fleet's model cache from the bench cache (verified once, shared by the benches)."""
    from grid.agent.artifacts import BUNDLED_MODEL_ID, BUNDLED_SHA256, ArtifactCache, ensure_bundled_model
    from grid.config import GridConfig

    cache_home = Path(os.environ.get("GRID_BENCH_CACHE", Path.home() / ".cache" / "grid-bench"))
    blob = ensure_bundled_model(GridConfig(home=cache_home, nats_url=None))
    cache = ArtifactCache(root / "models" / "artifacts")
    cache.ensure()
    target = cache.blob_path(BUNDLED_SHA256)
    if not target.exists():
        os.link(blob, target)
    cache.register(BUNDLED_MODEL_ID, BUNDLED_SHA256, target.stat().st_size)


async def run(rounds: int, threads: int, warmup: int) -> None:
    from grid.agent.state import AgentPaths, decode_state
    from grid.config import GridConfig
    from grid.testfleet.fleet import FleetSpec, fleet_root, start_fleet, stop_fleet
    from grid.testfleet.procs import prove

    with tempfile.TemporaryDirectory(prefix="grid-bench-fleet-") as tmp:
        root = fleet_root(GridConfig(home=Path(tmp), nats_url=None))
        _seed(root)
        direct: DirectPath | None = None
        try:
            state = await asyncio.to_thread(start_fleet, root, FleetSpec(machines=1, netns=True, engine_threads=threads))
            host = state.hosts[0]
            paths = AgentPaths.for_config(GridConfig(home=Path(host.home), nats_url=None))
            residency = decode_state(paths.state.read_bytes()).residencies[state.settings.model_id]
            engine_url = f"http://127.0.0.1:{residency.port}/v1/chat/completions"
            model = state.settings.model_id
            assert host.netns is not None
            direct = DirectPath(host.netns, engine_url, model, paths.engine_key)
            procs = {name: prove(rec) for name, rec in
                     (("gateway", state.gateway), ("nats-server", state.nats), ("host agent", host.agent))}
            remote_url = f"{state.gateway_url}/v1/chat/completions"
            results: dict[str, dict[str, list[float]]] = {k: {"direct": [], "remote": []} for k in ("plain", "ttft")}
            async with httpx.AsyncClient(trust_env=False, timeout=60.0) as client:
                async def remote(kind: str) -> float:
                    fn = one_plain if kind == "plain" else one_ttft
                    return await fn(client, remote_url, {}, model)

                paths_ = {"direct": direct.measure, "remote": remote}
                for _ in range(warmup):
                    for fn in paths_.values():
                        await fn("plain")
                        await fn("ttft")
                before = {n: cpu_seconds(p) for n, p in procs.items() if p is not None}
                for i in range(rounds):
                    order = ["direct", "remote"] if i % 2 == 0 else ["remote", "direct"]
                    for kind in ("plain", "ttft"):
                        for name in order:
                            results[kind][name].append(await paths_[name](kind))
                cpu_ms = {n: (cpu_seconds(p) - before[n]) * 1e3 / (2 * rounds) for n, p in procs.items()
                          if p is not None}
                r = await client.post(remote_url, json={"model": model, "max_tokens": 1, "messages": MESSAGES})
                served_by = r.headers.get("x-grid-host")
        finally:
            if direct is not None:
                direct.close()
            await asyncio.to_thread(stop_fleet, root)

    print(f"remote-host overhead: {rounds} interleaved rounds, llama-server threads={threads}, SmolLM2-135M Q4_1; "
          f"the host's agent and engine in network namespace {host.netns} ({host.address}), NATS with TLS on the "
          f"fleet bridge, gateway in the root namespace; direct calls from inside the namespace; load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus; served by X-Grid-Host={served_by}")
    added = print_latency_table(results, "direct", "remote")
    # Each round measures both paths back to back, so the per-round difference cancels most of
    # the load that other work puts on a shared machine (the medians above move by +-0.5 ms
    # between runs here; this moves much less).
    for kind, label in (("plain", "max_tokens=1 latency"), ("ttft", "stream first token")):
        diffs = [r - d for d, r in zip(results[kind]["direct"], results[kind]["remote"], strict=True)]
        print(f"{label}: per-round added median {pct(diffs, 0.5) * 1e3:.2f} ms, p90 {pct(diffs, 0.9) * 1e3:.2f} ms")
    print("CPU per remote request: " + ", ".join(f"{n} {ms:.3f} ms" for n, ms in cpu_ms.items())
          + f" (total {sum(cpu_ms.values()):.3f} ms)")
    print(f"goal median added <= 2 ms: {'met' if added <= 2.0 else 'NOT met'} ({added:.2f} ms)")


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "direct-client":
        asyncio.run(direct_client(sys.argv[2], sys.argv[3], Path(sys.argv[4])))
        return
    args = overhead_args(__doc__)
    asyncio.run(run(args.rounds, args.threads, args.warmup))


if __name__ == "__main__":
    main()
