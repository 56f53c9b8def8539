"""Remote-host overhead: an engine called directly from its own host, through a gateway beside
it (the floor), and through the gateway from another network namespace (the logical fleet's
--netns), in one run.

One run starts `gridctl test start --machines 1 --netns` in a temporary grid home: a secured
nats-server (TLS) on the fleet bridge, the controller, the gateway on the root namespace's
loopback, and one real host agent that joined by invitation and runs in its own namespace with
a real llama-server child (SmolLM2-135M Q4_1) bound to that namespace's loopback. The gateway
cannot reach the engine; every remote request goes gateway -> NATS (over the bridge) -> the
host's agent -> its engine, the path of a machine behind NAT.

Three paths, measured in the same rounds:
  * direct: the engine called with the host's own key, from inside the host's namespace;
  * floor: a second gateway process in the host's namespace (bench._common.serve_floor_gateway:
    the fleet's log over the bridge for its routes, upstream backend h1 with the engine's key)
    calling the engine straight over HTTP, from inside the namespace: the least a gateway in
    front of an engine adds (bench.gateway_floor), whatever carries the hop behind it;
  * remote: the fleet's gateway, from the root namespace.
Direct and floor are measured by a helper process in the namespace (`direct-client`) that times
each request itself; the bench asks it for one request at a time, so rounds stay interleaved
(the order of the paths turns each round), one keep-alive client per path:
  * sequential non-streaming chat, max_tokens=1 (end-to-end latency)
  * sequential streaming chat, time to the first content token
It prints median and p99 of each path against direct, the per-round differences (all paths
measured back to back: steadier on a shared machine), the remote hop beyond the floor (remote -
floor: median and per-round p50/p90) against the goal, and the CPU time per request of each
process on the remote path (gateway, nats-server, host agent) and of the floor gateway.
Goal (issue "The data path"): the remote hop adds <= 1.2 ms beyond the floor. Needs root
(network namespaces; the fleet removes the ones it made).

    python -m bench.remote_overhead [--rounds 200] [--threads 1]
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import psutil

from bench._common import (
    MESSAGES,
    CpuMeter,
    one_plain,
    one_ttft,
    overhead_args,
    pct,
    print_latency_table,
    seed_fleet_models,
    start_floor_gateway,
    stop_process,
)
from grid.testfleet import netns

PATHS = ["direct", "floor", "remote"]
REMOTE_PROCS = ("gateway", "nats-server", "host agent")
# Issue "The data path": the hop to another machine adds at most this beyond the floor
# measured in the same run.
GOAL_BEYOND_FLOOR_MS = 1.2


async def direct_client(engine_url: str, floor_url: str, model: str, key_file: Path) -> None:
    """Inside the host's namespace: for each line "<plain|ttft> <direct|floor>" on stdin, one
    request, to the engine with the host's key or through the floor gateway on the namespace's
    loopback; its latency in seconds on stdout."""
    key = key_file.read_text().strip()
    targets = {"direct": (engine_url, {"Authorization": f"Bearer {key}"}),
               "floor": (f"{floor_url}/v1/chat/completions", {})}
    loop = asyncio.get_running_loop()
    async with contextlib.AsyncExitStack() as stack:
        clients = {name: await stack.enter_async_context(httpx.AsyncClient(trust_env=False, timeout=60.0))
                   for name in targets}  # one keep-alive client per path
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            kind, path = line.split()
            measure = one_plain if kind == "plain" else one_ttft
            print(f"{await measure(clients[path], *targets[path], model):.9f}", flush=True)


class NamespacePaths:
    """The helper process in the host's namespace, asked for one measured request at a time."""

    def __init__(self, namespace: str, engine_url: str, floor_url: str, model: str, key_file: Path) -> None:
        repo = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen(
            [*netns.exec_prefix(namespace), sys.executable, "-m", "bench.remote_overhead", "direct-client",
             engine_url, floor_url, model, str(key_file)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True)

    async def measure(self, kind: str, path: str) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{kind} {path}\n")
        self.proc.stdin.flush()
        line = await asyncio.get_running_loop().run_in_executor(None, self.proc.stdout.readline)
        if not line:
            raise RuntimeError("the client in the host's namespace exited")
        return float(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()




async def run(rounds: int, threads: int, warmup: int, idle_seconds: float) -> None:
    from grid.agent.state import AgentPaths, decode_state
    from grid.config import GridConfig
    from grid.testfleet.fleet import FleetSpec, fleet_root, start_fleet, stop_fleet
    from grid.testfleet.procs import prove

    with tempfile.TemporaryDirectory(prefix="grid-bench-fleet-") as tmp:
        root = fleet_root(GridConfig(home=Path(tmp), nats_url=None))
        seed_fleet_models(root)
        inside: NamespacePaths | None = None
        floor_gateway: subprocess.Popen[bytes] | None = None
        try:
            state = await asyncio.to_thread(start_fleet, root, FleetSpec(machines=1, netns=True, engine_threads=threads))
            host = state.hosts[0]
            paths = AgentPaths.for_config(GridConfig(home=Path(host.home), nats_url=None))
            residency = decode_state(paths.state.read_bytes()).residencies[state.settings.model_id]
            engine_url = f"http://127.0.0.1:{residency.port}/v1/chat/completions"
            model = state.settings.model_id
            assert host.netns is not None
            # The floor gateway: beside the engine in the host's namespace, the fleet's gateway
            # credential (its log is the fleet's, over the bridge), the engine's key.
            env = {k: v for k, v in os.environ.items() if k not in ("GRID_NATS_URL", "GRID_AGENT_STATE_DIR")}
            env["GRID_HOME"] = state.control_home
            floor_gateway, floor_url = await asyncio.to_thread(
                start_floor_gateway, state.nats_url, paths.engine_key, env, root / "logs" / "floor-gateway.log",
                model=model, prefix=tuple(netns.exec_prefix(host.netns)))
            inside = NamespacePaths(host.netns, engine_url, floor_url, model, paths.engine_key)
            procs = {name: prove(rec) for name, rec in
                     (("gateway", state.gateway), ("nats-server", state.nats), ("host agent", host.agent))}
            procs["floor gateway"] = psutil.Process(floor_gateway.pid)  # `ip netns exec` execs it in place
            remote_url = f"{state.gateway_url}/v1/chat/completions"
            results: dict[str, dict[str, list[float]]] = {k: {p: [] for p in PATHS} for k in ("plain", "ttft")}
            async with httpx.AsyncClient(trust_env=False, timeout=60.0) as client:
                async def remote(kind: str) -> float:
                    fn = one_plain if kind == "plain" else one_ttft
                    return await fn(client, remote_url, {}, model)

                async def direct(kind: str) -> float:
                    return await inside.measure(kind, "direct")

                async def floor(kind: str) -> float:
                    return await inside.measure(kind, "floor")

                measure = {"direct": direct, "floor": floor, "remote": remote}
                for _ in range(warmup):
                    for fn in measure.values():
                        await fn("plain")
                        await fn("ttft")
                meter = CpuMeter({n: p for n, p in procs.items() if p is not None}, idle_seconds)
                await meter.idle()
                meter.start()
                for i in range(rounds):
                    order = PATHS if i % 2 == 0 else PATHS[::-1]
                    for kind in ("plain", "ttft"):
                        for name in order:
                            results[kind][name].append(await measure[name](kind))
                meter.stop(2 * rounds)
                r = await client.post(remote_url, json={"model": model, "max_tokens": 1, "messages": MESSAGES})
                served_by = r.headers.get("x-grid-host")
        finally:
            if inside is not None:
                inside.close()
            stop_process(floor_gateway)
            await asyncio.to_thread(stop_fleet, root)

    print(f"remote-host overhead: {rounds} interleaved rounds over 3 paths, llama-server threads={threads}, "
          f"SmolLM2-135M Q4_1; the host's agent and engine in network namespace {host.netns} ({host.address}), NATS "
          f"with TLS on the fleet bridge, gateway in the root namespace; direct and floor measured from inside the "
          f"namespace; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus; served by "
          f"X-Grid-Host={served_by}")
    print("floor = a gateway in the host's namespace calling the engine straight over HTTP with its key "
          "(no agent, no NATS): the least a gateway adds")
    floor_added = print_latency_table(results, "direct", "floor")
    print("remote = gateway (root namespace) -> NATS over the fleet bridge -> host agent -> engine")
    added = print_latency_table(results, "direct", "remote")
    # Each round measures every path back to back, so the per-round difference cancels most of
    # the load that other work puts on a shared machine (the medians above move by +-0.5 ms
    # between runs here; this moves much less).
    for kind, label in (("plain", "max_tokens=1 latency"), ("ttft", "stream first token")):
        for name in ("floor", "remote"):
            diffs = _diffs(results[kind], name, "direct")
            print(f"{label}: {name} per-round added median {pct(diffs, 0.5) * 1e3:.2f} ms, "
                  f"p90 {pct(diffs, 0.9) * 1e3:.2f} ms")
    print(f"median added: floor {floor_added:.2f} ms, remote {added:.2f} ms")
    print("the remote hop beyond the floor (remote - floor):")
    for kind, label in (("plain", "max_tokens=1 latency"), ("ttft", "stream first token")):
        beyond = (pct(results[kind]["remote"], 0.5) - pct(results[kind]["floor"], 0.5)) * 1e3
        diffs = _diffs(results[kind], "remote", "floor")
        print(f"  {label}: median {beyond:.2f} ms; per-round p50 {pct(diffs, 0.5) * 1e3:.2f} ms, "
              f"p90 {pct(diffs, 0.9) * 1e3:.2f} ms")
    remote_net = sum(meter.net[n] for n in REMOTE_PROCS if n in meter.net)
    remote_gross = sum(meter.gross[n] for n in REMOTE_PROCS if n in meter.gross)
    print(f"CPU per request, net of each process's idle rate (gross, background included): remote path {meter.line(REMOTE_PROCS)}, total {remote_net:.3f} ms "
          f"({remote_gross:.3f}); floor path {meter.line(('floor gateway',))}")
    print(meter.idle_line())
    beyond = (pct(results["plain"]["remote"], 0.5) - pct(results["plain"]["floor"], 0.5)) * 1e3
    print(f"goal: the remote hop adds <= {GOAL_BEYOND_FLOOR_MS} ms beyond the floor (median max_tokens=1, "
          f"remote - floor): {'met' if beyond <= GOAL_BEYOND_FLOOR_MS else 'NOT met'} ({beyond:.2f} ms)")


def _diffs(results: dict[str, list[float]], a: str, b: str) -> list[float]:
    """Per-round `a` - `b` (both measured in the same round)."""
    return [x - y for x, y in zip(results[a], results[b], strict=True)]


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "direct-client":
        asyncio.run(direct_client(sys.argv[2], sys.argv[3], sys.argv[4], Path(sys.argv[5])))
        return
    args = overhead_args(__doc__)
    asyncio.run(run(args.rounds, args.threads, args.warmup, args.idle_seconds))


if __name__ == "__main__":
    main()
