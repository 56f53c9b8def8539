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

Measured on this 2-core machine, shared (load average 2.4), 200 rounds: max_tokens=1 median added
2.74 ms, first token 3.34 ms. A streamed answer's head now crosses alone as soon as the engine
sends it (llama-server: about 1.5 ms after the request, its first chunk about 12 ms later), and the
gateway sends its client that head at once, uncorked: before, the agent held the head back for the
first chunk, so the gateway's response set-up and the client's reading of the head sat on the
first token's path, which the direct path (head long read) never pays. Before that change, same
conditions (load 2.2-3.3, four runs): first token 2.93-4.83 ms added against 2.97-3.54 for
max_tokens=1.

No `--upstream h1|httpx` any more: those gateway backends only reach engines that take no key,
and no engine a Grid agent starts is one (each runs with its host's own key, which the gateway
never holds), so comparing them would time a path no user's request takes. The agent's own
engine hop uses grid.transport.h1's pool (grid.agent.engine_client), and is in every figure here;
bench.engine_hop measures that hop alone against httpx and aiohttp.

    python -m bench.gateway_overhead [--rounds 200] [--threads 1]

`--one-process` measures `gridctl up`'s composition instead: a LocalGrid (embedded nats-server
with identities, controller, gateway and host agent in one process, the agent's llama-server
child) in a process of its own, the bench's client outside it. Each round calls the engine
directly, through the gateway with the request handed to the agent in process
(grid.infer.local), and through the gateway with the agent taken out of the registry, so the
same process sends it over NATS (order rotating each round). It prints the latency table of
both gateway paths against the direct one, their difference, and the CPU per request of the
grid process and of nats-server on each path (each request's CPU delta, summed per path).

    python -m bench.gateway_overhead --one-process [--rounds 200]

Measured on this 2-core machine, shared (load average 2.6), 60 rounds: max_tokens=1 median added
0.48 ms in process against 2.88 ms over NATS, first token -1.12 against 2.22 ms; per round NATS
took 1.35 ms (plain) and 1.85 ms (first token) longer; CPU per request of the grid process 8.2 ms
in process, 13.1 ms over NATS, 5.8 ms around a direct call (its background: controller ticks,
heartbeats, the analytics sink), nats-server 0.5 against 2.7 ms. With a stream's head sent
ahead of its first chunk (load average 2.7, 200 rounds): max_tokens=1 added 1.23 ms in process and
2.14 ms over NATS, first token 2.07 and 3.39 ms (before, load 2.7-4.6: first token 3.12-3.65 in
process, 3.93-4.03 over NATS). Part of the first-token figure is this mode's client, not Grid: one
keep-alive client serves all three ways and each stream closes its connection, so the second
gateway stream of a round opens a connection where the direct stream never does.

`--hop` isolates the hop that `--one-process` removes, without the HTTP front, the controller
or the gateway's routing around it: one process holds an `InferenceResponder` (the agent's, with
the agent's engine client and the engine key) and two requesters on their own NATS connection,
one with that responder in its registry (grid.infer.local) and one without; they alternate
non-streamed max_tokens=1 requests to one llama-server. It prints each path's median latency,
the per-pair difference, and the CPU per request of that process and of nats-server.

    python -m bench.gateway_overhead --hop [--rounds 300]

Measured here (load average 4.0, 300 pairs): CPU per request 0.57 ms in the process and 0.13 ms
in nats-server in process, against 1.80 and 0.53 ms over NATS; per pair NATS 0.98 ms slower.

`--litellm LITELLM` adds LiteLLM's proxy as a third path in the same interleaved run: the proxy
(its own process, started by the bench from the `litellm` executable given) forwards to the same
engine with its key, so both proxies are measured against one direct baseline in one run. LiteLLM
is not a Grid dependency; install it in an environment of its own:

    python3 -m venv ~/.litellm && ~/.litellm/bin/pip install 'litellm[proxy]'
    python -m bench.gateway_overhead --litellm ~/.litellm/bin/litellm [--rounds 200]

It prints the latency table of each proxy against the direct path, each proxy's added median
(max_tokens=1 and the first streamed token) and Grid's as a fraction of LiteLLM's. Goal: Grid
<= 0.05x LiteLLM. Measured here (LiteLLM 1.108.7 from PyPI, one worker; load average 1.6, 200 rounds):
Grid added 2.52 ms to max_tokens=1 and 1.99 ms to the first token, LiteLLM 16.69 and 16.41 ms
(0.151x and 0.121x); with the head held back for the first chunk (load 1.8) Grid's first token
was 3.88 ms against 2.97 for max_tokens=1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import psutil

from bench._common import (
    MODEL_ID,
    cpu_seconds,
    interleaved,
    one_host_grid,
    one_plain,
    one_ttft,
    overhead_rounds,
    pct,
    print_latency_table,
)


@contextlib.asynccontextmanager
async def litellm_proxy(executable: str, engine: str, key: str, model: str) -> AsyncIterator[
        tuple[tuple[str, dict[str, str]], psutil.Process]]:
    """LiteLLM's proxy on a free loopback port, forwarding `model` to `engine` with its key; yields
    its chat URL with the client headers it needs, and its process. The engine key is in a config
    file only this user can read. The proxy refuses to start without a master key of its own, so
    its clients send one (Grid's gateway in this run requires no client key)."""
    import secrets

    from grid.transport.embedded import free_port

    port = free_port()
    master_key = "sk-" + secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="grid-bench-litellm-") as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(json.dumps({"model_list": [{"model_name": model, "litellm_params": {
            "model": f"openai/{model}", "api_base": f"{engine}/v1", "api_key": key}}]}))
        config.chmod(0o600)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env["LITELLM_LOG"] = "ERROR"
        env["LITELLM_MASTER_KEY"] = master_key
        with open(Path(tmp) / "litellm.log", "wb") as out:
            proc = subprocess.Popen([executable, "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
                                     "--num_workers", "1"], env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 180
            async with httpx.AsyncClient(trust_env=False, timeout=5.0) as c:
                while True:
                    if proc.poll() is not None:
                        raise RuntimeError(f"litellm exited with {proc.returncode}: "
                                           + (Path(tmp) / "litellm.log").read_text()[-2000:])
                    try:
                        if (await c.get(f"{url}/health/liveliness")).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    if time.monotonic() > deadline:
                        raise RuntimeError("litellm's proxy did not answer within 180 s")
                    await asyncio.sleep(0.5)
            yield (f"{url}/v1/chat/completions", {"Authorization": f"Bearer {master_key}"}), psutil.Process(proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


async def run_litellm(executable: str, rounds: int, threads: int, warmup: int) -> None:
    async with one_host_grid(threads=threads) as grid:
        async with litellm_proxy(executable, grid.endpoint, grid.key, MODEL_ID) as (litellm_path, litellm_proc):
            procs = {n: p for n, p in grid.procs.items() if n != "engine"} | {"litellm": litellm_proc}
            results, cpu_ms = await interleaved({"direct": grid.direct, "gateway": grid.via, "litellm": litellm_path},
                                                rounds=rounds, warmup=warmup, procs=procs)
    print(f"Grid's gateway and LiteLLM's proxy on one engine: {rounds} interleaved rounds, llama-server "
          f"threads={threads}, SmolLM2-135M Q4_1, load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus")
    added = {}
    for proxy in ("gateway", "litellm"):
        print(f"-- {proxy}")
        print_latency_table(results, "direct", proxy)
        added[proxy] = {kind: (pct(results[kind][proxy], 0.5) - pct(results[kind]["direct"], 0.5)) * 1e3
                        for kind in ("plain", "ttft")}
    for kind, label in (("plain", "max_tokens=1"), ("ttft", "first token")):
        g, lite = added["gateway"][kind], added["litellm"][kind]
        print(f"{label}: median added Grid {g:.2f} ms, LiteLLM {lite:.2f} ms, Grid/LiteLLM {g / lite:.3f}"
              + ("" if lite > 0 else " (LiteLLM added nothing measurable)"))
    grid_cpu = cpu_ms["gateway"] + cpu_ms["host agent"] + cpu_ms["nats-server"]
    print(f"CPU per request: Grid's path {grid_cpu:.3f} ms (gateway {cpu_ms['gateway']:.3f}, host agent "
          f"{cpu_ms['host agent']:.3f}, nats-server {cpu_ms['nats-server']:.3f}); LiteLLM {cpu_ms['litellm']:.3f} ms "
          "(each over all requests of the run: a process's idle work is spread over both paths)")
    ratio = added["gateway"]["plain"] / added["litellm"]["plain"] if added["litellm"]["plain"] > 0 else float("inf")
    print(f"goal Grid <= 0.05x LiteLLM (max_tokens=1): {'met' if ratio <= 0.05 else 'NOT met'} ({ratio:.3f})")


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


# Lines of the grid process's protocol (among its own progress lines).
READY = "bench-grid-ready "
SWITCHED = "bench-grid-switched"


async def serve_one_process(home: Path) -> None:
    """The grid process of `--one-process`: start a LocalGrid, print where it serves, then for
    each stdin line "in-process" or "nats" route the agent's requests that way and answer "ok"."""
    from grid.agent.service import AgentOptions
    from grid.config import GridConfig
    from grid.localgrid import LocalGrid

    grid = LocalGrid(GridConfig(home=home, nats_url=None), agent_options=AgentOptions(failure_domain="local"))
    await grid.start()
    try:
        model = grid.profile.model_id
        deadline = time.monotonic() + 180
        while grid.residency_state(model) != "ready":
            if time.monotonic() > deadline:
                raise RuntimeError(f"{model} never became ready")
            await asyncio.sleep(0.2)
        agent = grid.agent
        assert grid.embedded is not None and grid.embedded.process is not None
        print(READY + json.dumps({"gateway": grid.gateway_url, "model": model, "host": agent.host_id,
                          "engine": f"http://127.0.0.1:{agent.state.residencies[model].port}",
                          "key_file": str(agent.paths.engine_key), "nats_pid": grid.embedded.process.pid}),
              flush=True)
        loop = asyncio.get_running_loop()
        while line := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
            if line == "nats":
                grid.local.remove(agent.host_id)
            else:
                grid.local.add(agent.host_id, lambda: agent.responder)
            print(SWITCHED, flush=True)
    finally:
        await grid.stop()


class OneProcessGrid:
    """The grid process, told which way its gateway reaches its own agent."""

    def __init__(self, home: Path) -> None:
        from grid.agent.artifacts import ensure_bundled_model
        from grid.config import GridConfig

        cache_home = Path(os.environ.get("GRID_BENCH_CACHE", Path.home() / ".cache" / "grid-bench"))
        ensure_bundled_model(GridConfig(home=cache_home, nats_url=None))
        (home / "artifacts").symlink_to(cache_home / "artifacts")
        repo = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ, GRID_HOME=str(home),
                   PYTHONPATH=os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])))
        env.pop("GRID_NATS_URL", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.gateway_overhead", "one-process-grid", str(home)],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info: dict[str, object] = {}

    async def started(self) -> dict[str, object]:
        line = await asyncio.to_thread(self._readline, READY)
        self.info = json.loads(line)
        return self.info

    def _readline(self, prefix: str) -> str:
        """The next line of ours (the grid also writes its own progress to stdout)."""
        assert self.proc.stdout is not None
        while line := self.proc.stdout.readline():
            if line.startswith(prefix):
                return line[len(prefix):]
        raise RuntimeError("the grid process exited")

    async def route(self, way: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(way + "\n")
        self.proc.stdin.flush()
        await asyncio.to_thread(self._readline, SWITCHED)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def run_one_process(rounds: int, warmup: int) -> None:
    ways = ("direct", "in-process", "nats")
    with tempfile.TemporaryDirectory(prefix="grid-bench-up-") as tmp:
        grid = OneProcessGrid(Path(tmp))
        try:
            info = await grid.started()
            model = str(info["model"])
            key = Path(str(info["key_file"])).read_text().strip()
            urls = {"direct": (f"{info['engine']}/v1/chat/completions", {"Authorization": f"Bearer {key}"}),
                    "in-process": (f"{info['gateway']}/v1/chat/completions", {}),
                    "nats": (f"{info['gateway']}/v1/chat/completions", {})}
            procs = {"grid process": psutil.Process(grid.proc.pid), "nats-server": psutil.Process(int(info["nats_pid"]))}
            results: dict[str, dict[str, list[float]]] = {k: {w: [] for w in ways} for k in ("plain", "ttft")}
            cpu = {w: {n: 0.0 for n in procs} for w in ways}
            async with httpx.AsyncClient(trust_env=False, timeout=60.0) as client:
                async def one(kind: str, way: str, measured: bool) -> None:
                    if way != "direct":
                        await grid.route(way)
                    url, headers = urls[way]
                    before = {n: cpu_seconds(p) for n, p in procs.items()}
                    fn = one_plain if kind == "plain" else one_ttft
                    latency = await fn(client, url, headers, model)
                    if measured:
                        results[kind][way].append(latency)
                        for n, p in procs.items():
                            cpu[way][n] += cpu_seconds(p) - before[n]

                for _ in range(warmup):
                    for way in ways:
                        await one("plain", way, False)
                        await one("ttft", way, False)
                for i in range(rounds):
                    order = ways[i % 3:] + ways[:i % 3]
                    for kind in ("plain", "ttft"):
                        for way in order:
                            await one(kind, way, True)
        finally:
            grid.close()

    print(f"gateway overhead, one process (`gridctl up`'s composition: embedded nats-server with identities, "
          f"controller, gateway and agent in one process, bundled SmolLM2-135M Q4_1): {rounds} interleaved rounds, "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus")
    for way in ("in-process", "nats"):
        print(f"-- gateway -> agent {way}")
        print_latency_table(results, "direct", way)
    for kind, label in (("plain", "max_tokens=1 latency"), ("ttft", "stream first token")):
        diffs = [n - i for i, n in zip(results[kind]["in-process"], results[kind]["nats"], strict=True)]
        print(f"{label}: nats - in-process per round, median {pct(diffs, 0.5) * 1e3:.2f} ms, "
              f"p90 {pct(diffs, 0.9) * 1e3:.2f} ms")
    for way in ways:
        per = {n: ms * 1e3 / (2 * rounds) for n, ms in cpu[way].items()}
        print(f"CPU per request, {way}: " + ", ".join(f"{n} {ms:.3f} ms" for n, ms in per.items())
              + f" (total {sum(per.values()):.3f} ms)")


async def run_hop(rounds: int, warmup: int, threads: int) -> None:
    import secrets

    from grid.agent.artifacts import ensure_bundled_model
    from grid.agent.engine_client import H1EngineClient
    from grid.agent.engines.llama_cpp import EngineSpec, spawn
    from grid.agent.engines.runtime import find_runtime, xllamacpp_runtime
    from grid.config import GridConfig
    from grid.infer.client import InferTarget, NatsUpstream
    from grid.infer.local import LocalResponders
    from grid.infer.responder import EngineRoute, InferenceResponder
    from grid.transport.embedded import EmbeddedNats, free_port
    from grid.transport.jetstream import JetStreamLog

    cache = Path(os.environ.get("GRID_BENCH_CACHE", Path.home() / ".cache" / "grid-bench"))
    model_path = ensure_bundled_model(GridConfig(home=cache, nats_url=None))
    runtime = find_runtime(None) or xllamacpp_runtime()
    with tempfile.TemporaryDirectory(prefix="grid-bench-hop-") as tmp:
        key = secrets.token_urlsafe(24)
        key_file = Path(tmp) / "engine.key"
        key_file.write_text(key)
        key_file.chmod(0o600)
        spec = EngineSpec(model_id="smol", model_path=model_path, port=free_port(), key_file=key_file, slots=1,
                          context_size=1024, threads=threads)
        engine = spawn(runtime.command, spec, Path(tmp) / "engine.log")
        server = EmbeddedNats(Path(tmp) / "nats")
        server.start()
        try:
            await _wait_engine(spec.endpoint, key)
            agent_log = await JetStreamLog.connect(server.url, name="bench-agent")
            gateway_log = await JetStreamLog.connect(server.url, name="bench-gateway")
            responder = InferenceResponder(agent_log.client, "bench-host", lambda _m: EngineRoute(spec.endpoint, key),
                                           engine_client=H1EngineClient())
            await responder.start()
            local = LocalResponders()
            local.add("bench-host", lambda: responder)
            upstreams = {"in-process": NatsUpstream(gateway_log.client, local=local),
                         "nats": NatsUpstream(gateway_log.client)}
            procs = {"this process": psutil.Process(), "nats-server": psutil.Process(server.process.pid)}  # type: ignore[union-attr]
            body = json.dumps({"model": "smol", "max_tokens": 1, "temperature": 0,
                               "messages": [{"role": "user", "content": "Say hello."}]}).encode()
            target = InferTarget("bench-host", "smol", "/v1/chat/completions")
            latency: dict[str, list[float]] = {w: [] for w in upstreams}
            cpu = {w: {n: 0.0 for n in procs} for w in upstreams}
            for i in range(warmup + rounds):
                for way in (list(upstreams) if i % 2 else list(upstreams)[::-1]):
                    before = {n: cpu_seconds(p) for n, p in procs.items()}
                    t0 = time.perf_counter()
                    resp = await upstreams[way].post(target, body, [(b"content-type", b"application/json")])
                    await resp.aread()
                    await resp.aclose()
                    elapsed = time.perf_counter() - t0
                    if resp.status_code != 200:
                        raise RuntimeError(f"{way}: HTTP {resp.status_code}")
                    if i >= warmup:
                        latency[way].append(elapsed)
                        for n, p in procs.items():
                            cpu[way][n] += cpu_seconds(p) - before[n]
            delivered = responder.delivered_in_process
            await responder.stop()
            await agent_log.close()
            await gateway_log.close()
        finally:
            engine.terminate()
            engine.wait(15)
            server.stop()

    print(f"the hop alone: requester and agent responder in one process, {rounds} alternating pairs, "
          f"max_tokens=1, llama-server threads={threads}, load average {os.getloadavg()[0]:.2f} on "
          f"{os.cpu_count()} cpus ({delivered - warmup} requests served in process)")
    for way, xs in latency.items():
        per = {n: c * 1e3 / rounds for n, c in cpu[way].items()}
        print(f"{way:<11} median {pct(xs, 0.5) * 1e3:.3f} ms, p90 {pct(xs, 0.9) * 1e3:.3f} ms; CPU per request "
              + ", ".join(f"{n} {ms:.3f} ms" for n, ms in per.items()) + f" (total {sum(per.values()):.3f} ms)")
    diffs = [n - i for i, n in zip(latency["in-process"], latency["nats"], strict=True)]
    print(f"nats - in-process per pair: median {pct(diffs, 0.5) * 1e3:.3f} ms, p90 {pct(diffs, 0.9) * 1e3:.3f} ms")


async def _wait_engine(endpoint: str, key: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(trust_env=False) as c:
        while time.monotonic() < deadline:
            try:
                if (await c.get(f"{endpoint}/health", headers={"Authorization": f"Bearer {key}"})).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("the engine did not become healthy")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "one-process-grid":
        asyncio.run(serve_one_process(Path(sys.argv[2])))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200, help="interleaved measured rounds")
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured rounds first")
    parser.add_argument("--threads", type=int, default=1, help="llama-server threads (2 cores here)")
    parser.add_argument("--one-process", action="store_true",
                        help="gridctl up's composition: in-process against NATS for the gateway's own host")
    parser.add_argument("--hop", action="store_true",
                        help="the requester-to-responder hop alone, in process against over NATS")
    parser.add_argument("--litellm", metavar="LITELLM", default=None,
                        help="the `litellm` executable of an environment of its own: adds LiteLLM's proxy to the run")
    args = parser.parse_args()
    args.rounds, args.warmup = max(1, args.rounds), max(0, args.warmup)
    if args.litellm:
        asyncio.run(run_litellm(args.litellm, args.rounds, args.threads, args.warmup))
    elif args.hop:
        asyncio.run(run_hop(args.rounds, args.warmup, args.threads))
    elif args.one_process:
        asyncio.run(run_one_process(args.rounds, args.warmup))
    else:
        asyncio.run(run(args.rounds, args.threads, args.warmup))


if __name__ == "__main__":
    main()
