"""Shared benchmark helpers: a real embedded nats-server in a temp dir, timing, fleets, and a
one-host grid as a user gets it by default (`one_host_grid`).

`python -m bench._common serve-agent NATS_URL ENDPOINT KEY_FILE` is the host agent's side of
inference that `one_host_grid` runs as its own process, on the agent's event loop
(grid.eventloop; GRID_EVENT_LOOP=asyncio runs every process of a bench on the standard loop).
`python -m bench._common serve-floor-gateway NATS_URL KEY_FILE MODEL` is the floor gateway of
bench.gateway_floor and bench.remote_overhead (`serve_floor_gateway`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any
from pathlib import Path

import httpx
import msgspec
import psutil

from grid.events.base import new_event_id
from grid.events.host import HostHeartbeat, HostLoad, HostResources, Residency
from grid.events.requests import RequestFeatures
from grid.transport.embedded import EmbeddedNats, free_port
from grid.transport.jetstream import JetStreamLog

REPO = Path(__file__).resolve().parents[1]
HOST_ID = "bench-host"
MODEL_ID = "smollm2"
MESSAGES = [{"role": "user", "content": "Say hello."}]


@contextlib.contextmanager
def embedded_server() -> Iterator[EmbeddedNats]:
    with tempfile.TemporaryDirectory(prefix="grid-bench-") as d:
        server = EmbeddedNats(Path(d))  # the real configuration: file store, sync_interval always
        server.start()
        try:
            yield server
        finally:
            server.stop()


@dataclass
class SecuredGrid:
    """A nats-server in operator mode and a creds file per role, for benches of the secured path,
    with the hosts' ingress running on a controller connection (a host's appends are stored only
    through it: grid.controller.ingress)."""

    url: str
    authority: Any
    creds: dict[Any, Path]
    directory: Path
    ingress: Any


def wide_ingress() -> Any:
    """The ingress with every kind's budget opened wide: benches of the append path measure what
    it costs per message, not how fast one host may send (its budget, grid.controller.ingress)."""
    from grid.controller.ingress import INGRESS_POLICIES, HostIngress, IngressBudget
    from grid.projections.budget import BudgetPolicy

    wide = BudgetPolicy(rate_per_second=1e9, burst_messages=1e9, bytes_per_second=1e12, burst_bytes=1e12)
    return HostIngress(IngressBudget({kind: wide for kind in INGRESS_POLICIES}))


@contextlib.asynccontextmanager
async def secured_grid(prefix: str, host_id: str) -> AsyncIterator[SecuredGrid]:
    """The real configuration with identities (file store, sync_interval always, user JWTs): the
    controller has made the streams, and the controller, host `host_id` and operator each hold a
    credential (they sign what they append, and their readers verify)."""
    from grid.identity.authority import Authority
    from grid.identity.connect import connect_log
    from grid.identity.permissions import Principal, Role
    from grid.identity.server import SecuredEmbeddedNats

    with tempfile.TemporaryDirectory(prefix=prefix) as d:
        directory = Path(d)
        authority = Authority(directory / "identity")
        now = time.time()
        creds = {
            role: authority.issue_creds(Principal(role, host_id=host_id if role is Role.HOST else None),
                                        directory / f"{role.value}.creds", now=now, ttl_seconds=3600.0)
            for role in (Role.CONTROLLER, Role.HOST, Role.OPERATOR)
        }
        server = SecuredEmbeddedNats(directory / "nats", authority)
        server.start()
        try:
            # The controller creates the streams; the host and the operator may not.
            controller = await connect_log(server.url, credentials=creds[Role.CONTROLLER], name="bench-ingress")
            ingress = wide_ingress()
            await ingress.start(controller.client)
            try:
                yield SecuredGrid(server.url, authority, creds, directory, ingress)
            finally:
                await ingress.stop()
                await controller.close()
        finally:
            server.stop()


class Timer:
    def __enter__(self) -> "Timer":
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start


def heartbeat(i: int, hosts: int = 256) -> HostHeartbeat:
    host = f"host-{i % hosts:04d}"
    return HostHeartbeat(
        event_id=f"hb-{i}",
        at=1_800_000_000.0 + i,
        host_id=host,
        resources=HostResources(capacity_mb=65536, reserved_mb=4096, backends=("cuda",), failure_domain=f"rack-{i % 8}",
                                tags=("gpu", "always-on"), gpu_count=1, gpu_memory_mb=24576),
        residencies=tuple(
            Residency(model_id=f"model-{(i + k) % 32}.gguf", memory_mb=8000, state="ready", loaded_age_seconds=600.0,
                      last_used_age_seconds=2.0, active_requests=k, max_concurrency=4, endpoint=f"http://10.0.0.{i % 250}:{20000 + k}")
            for k in range(3)
        ),
        disk_free_bytes=100 << 30,
        disk_total_bytes=500 << 30,
        load=HostLoad(active_tasks=2, queue_depth=1, cpu_percent=40.0),
    )


def request_record(i: int) -> RequestFeatures:
    return RequestFeatures(
        endpoint="chat", requested_model=f"model-{i % 32}.gguf", served_model=f"model-{i % 32}.gguf",
        host_id=f"host-{i % 256:04d}", input_units=100 + i % 50, output_units=40, workload="coding",
        service_seconds=0.2 + (i % 10) / 10, finished_at=1_800_000_000.0 + i / 1000,
    )


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))
    return s[k]


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


class CpuMeter:
    """Each process's CPU time per request over measured rounds: gross (everything it did
    meanwhile) and net of its idle rate (the same process's CPU per second while nothing was
    asked of it, measured just before: heartbeats, log follow, a fleet's controller ticks).

    The gross figure charges a process's background work to the requests in proportion to how
    long they take (an engine answer of 60 ms carries 60 ms of heartbeats and log follow); the
    net one is what the requests themselves cost, an estimate: the background does not stop
    for them. Process CPU times tick at 10 ms, so short rounds round coarsely; a negative net
    figure says the background varied by more than the requests cost (a machine loaded by other
    work, where even an idle process's CPU time swells): read the gross one then."""

    def __init__(self, procs: dict[str, psutil.Process], idle_seconds: float) -> None:
        self.procs = procs
        self.idle_seconds = idle_seconds
        self.idle_ms_per_s: dict[str, float] = {n: 0.0 for n in procs}
        self.gross: dict[str, float] = {}
        self.net: dict[str, float] = {}
        self._before: dict[str, float] = {}
        self._t0 = 0.0

    async def idle(self) -> None:
        """Measure the idle rates (after the warmup: startup work is over by then)."""
        if self.idle_seconds <= 0:
            return
        before = {n: cpu_seconds(p) for n, p in self.procs.items()}
        t0 = time.perf_counter()
        await asyncio.sleep(self.idle_seconds)
        elapsed = time.perf_counter() - t0
        self.idle_ms_per_s = {n: (cpu_seconds(p) - before[n]) * 1e3 / elapsed for n, p in self.procs.items()}

    def start(self) -> None:
        self._before = {n: cpu_seconds(p) for n, p in self.procs.items()}
        self._t0 = time.perf_counter()

    def stop(self, requests: int) -> None:
        elapsed = time.perf_counter() - self._t0
        self.gross = {n: (cpu_seconds(p) - self._before[n]) * 1e3 / requests for n, p in self.procs.items()}
        self.net = {n: self.gross[n] - self.idle_ms_per_s[n] * elapsed / requests for n in self.procs}

    def line(self, names: list[str] | tuple[str, ...]) -> str:
        """"name net ms (gross ms)" for each of `names`."""
        return ", ".join(f"{n} {self.net[n]:.3f} ms ({self.gross[n]:.3f})" for n in names if n in self.net)

    def idle_line(self) -> str:
        return (f"idle CPU ms per second over {self.idle_seconds:.0f} s after the warmup: "
                + ", ".join(f"{n} {v:.1f}" for n, v in self.idle_ms_per_s.items()))


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


async def placed(log: JetStreamLog) -> None:
    """What a controller records and the host's agent acks before the gateway routes to a managed
    engine (grid.projections.placed): a plan assigning the model to the host and listing the pair
    as corroborated (a command the controller issued, acknowledged), and the host's succeeded warm."""
    from grid.events.acks import ActionAck
    from grid.events.plan import PlanCreated, make_generation
    from grid.fleet.planning import Placement, Plan, encode_plan

    now = time.time()
    digest = "0" * 64
    generation = make_generation("bench", 1, digest)
    plan = Plan(planner_version="bench", inputs_digest=digest, now=now, placements=(
        Placement(model_id=MODEL_ID, host_id=HOST_ID, runtime="llama.cpp", memory_mb=300, status="new"),))
    await log.append(PlanCreated(event_id=new_event_id(), at=now, planner_version="bench", generation=generation,
                                 epoch="bench", sequence=1, inputs_digest=digest, based_on={}, now=now,
                                 controller_id="bench", controller_term=1, plan=msgspec.Raw(encode_plan(plan)),
                                 corroborated=((HOST_ID, MODEL_ID),)))
    await log.append(ActionAck(event_id=new_event_id(), at=now, host_id=HOST_ID, action_id="bench-warm",
                               status="succeeded", kind="warm", model_id=MODEL_ID, generation=generation,
                               controller_term=1))


async def heartbeats(log: JetStreamLog, endpoint: str, slots: int, stop: asyncio.Event) -> None:
    """What the host's agent tells the fleet every 5 s: its one ready engine (the engine key
    is never in an event), after the plan and warm ack that let the gateway route to it."""
    await placed(log)
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


async def one_plain(client: httpx.AsyncClient, url: str, headers: dict[str, str], model: str = MODEL_ID) -> float:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 1, "temperature": 0}
    t0 = time.perf_counter()
    r = await client.post(url, json=body, headers=headers)
    dt = time.perf_counter() - t0
    if r.status_code != 200:
        raise RuntimeError(f"{url}: HTTP {r.status_code} {r.text[:200]}")
    return dt


async def one_ttft(client: httpx.AsyncClient, url: str, headers: dict[str, str], model: str = MODEL_ID) -> float:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 4, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    first: float | None = None
    # llama-server closes the connection after a stream without announcing it; both paths
    # therefore open a fresh engine connection per stream (the host agent does the same).
    async with client.stream("POST", url, json=body, headers={**headers, "Connection": "close"}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {r.status_code}")
        async for line in r.aiter_lines():
            if first is None and line.startswith("data:") and '"content":"' in line:
                first = time.perf_counter() - t0
    if first is None:
        raise RuntimeError("stream carried no content token")
    return first


async def serve_agent(nats_url: str, endpoint: str, key_file: Path) -> None:
    """The host's side: serve `grid.infer.<HOST_ID>` until SIGTERM, as grid.agent.service does
    (an `InferenceResponder` adding the host's own key, the agent's engine client)."""
    from grid.agent.engine_client import H1EngineClient
    from grid.infer.responder import EngineRoute, InferenceResponder
    from grid.secrets import read_secret

    route = EngineRoute(endpoint, read_secret(key_file))
    log = await JetStreamLog.connect(nats_url, name=f"agent-{HOST_ID}")
    responder = InferenceResponder(log.client, HOST_ID, lambda m: route if m == MODEL_ID else None,
                                   engine_client=H1EngineClient())
    await responder.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("serving", flush=True)
    await stop.wait()
    await responder.stop()
    await log.close()


class KeyedEngineHop:
    """The floor gateway's upstream client: grid.transport.h1 straight to the engine's URL, with
    the engine's key added to every request as the host's agent adds it on its own host
    (grid.infer.responder.engine_request_headers; the gateway forwards no Authorization).

    Bench only. A user's gateway never holds an engine key (grid.gateway.upstream), and every
    engine an agent starts takes one; the floor keeps that engine as it is and hands its key to
    this one bench gateway instead, so the floor is the least a gateway in front of such an
    engine can add."""

    __slots__ = ("_authorization", "_pool")

    def __init__(self, pool: Any, key: str) -> None:
        self._pool = pool
        self._authorization = (b"authorization", f"Bearer {key}".encode("latin-1"))

    async def post(self, target: Any, body: bytes, headers: list[tuple[bytes, bytes]]) -> Any:
        return await self._pool.post(target, body, [self._authorization, *headers])

    async def aclose(self) -> None:
        await self._pool.aclose()


async def serve_floor_gateway(nats_url: str, key_file: Path, model: str) -> None:
    """A gateway process as `gridctl serve gateway` runs it (same app, listener, logging and NATS
    connection: GRID_HOME's gateway credential and CA when it has them), except that its upstream
    is the h1 backend with the engine's key (`KeyedEngineHop`): no agent, no NATS on the request
    path. Prints its URL once it lists `model`, serves until SIGTERM."""
    import dataclasses

    from grid.config import GridConfig
    from grid.gateway.app import create_gateway_app, start_gateway
    from grid.gateway.settings import GatewaySettings
    from grid.identity.connect import connect_log
    from grid.identity.local import local_credential, local_tls_ca
    from grid.logs import configure_logging
    from grid.secrets import read_secret

    configure_logging("auto")
    cfg = GridConfig.from_environ()
    creds = local_credential(cfg.home, "gateway")
    log = await connect_log(nats_url, credentials=creds, tls_ca=local_tls_ca(cfg.home) if creds else None,
                            name="grid-floor-gateway", ensure_streams=creds is None)
    try:
        settings = dataclasses.replace(GatewaySettings.from_environ(), upstream_backend="h1")
        app = create_gateway_app(log, cfg, settings=settings)
        running = await start_gateway(app, "127.0.0.1", 0, write_url_file=False)
        try:
            upstream = app.state.gateway.upstream  # made by the app's startup, before any request
            upstream.client = KeyedEngineHop(upstream.client, read_secret(key_file))
            stop = asyncio.Event()
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
            await wait_listed(running.url, model)  # asked here: the caller may be in another namespace
            print(running.url, flush=True)
            await stop.wait()
        finally:
            await running.stop()
    finally:
        await log.close()


def start_floor_gateway(nats_url: str, key_file: Path, env: dict[str, str], log_path: Path, *,
                        model: str = MODEL_ID, prefix: tuple[str, ...] = ()) -> tuple[subprocess.Popen[bytes], str]:
    """`serve_floor_gateway` as its own process (behind `prefix`, e.g. `ip netns exec NS`, which
    execs it in place: the pid is the gateway's); returns it and its URL once it lists `model`."""
    gw_env = {k: v for k, v in env.items() if not k.startswith("GRID_GATEWAY_")}  # the defaults
    gw_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.Popen([*prefix, sys.executable, "-m", "bench._common", "serve-floor-gateway", nats_url,
                             str(key_file), model], env=gw_env, stdout=subprocess.PIPE, stderr=open(log_path, "wb"))
    assert proc.stdout is not None
    url = proc.stdout.readline().decode().strip()
    if not url.startswith("http://"):
        stop_process(proc)
        raise RuntimeError("the floor gateway did not start: " + log_path.read_text()[-3000:])
    return proc, url


async def wait_listed(url: str, model: str = MODEL_ID, log_path: Path | None = None, timeout: float = 60.0) -> None:
    """Until the gateway at `url` lists `model` (it has folded the plan and a heartbeat)."""
    async with httpx.AsyncClient(trust_env=False, timeout=60.0) as c:
        deadline = time.monotonic() + timeout
        while model not in (await c.get(f"{url}/v1/models")).text:
            if time.monotonic() > deadline:
                tail = log_path.read_text()[-3000:] if log_path is not None else ""
                raise RuntimeError(f"the gateway at {url} never listed {model}: {tail}")
            await asyncio.sleep(0.1)


def stop_process(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


@dataclass
class OneHostGrid:
    """A running one-host grid: `direct` calls the engine with the host's key, `via` goes
    through the gateway (no key), which reaches the engine through the host agent over NATS."""

    endpoint: str
    key: str
    gateway_url: str
    procs: dict[str, psutil.Process]  # gateway, nats-server, host agent, engine
    # `one_host_grid(floor=True)`: a second gateway calling the engine straight over HTTP.
    floor_url: str | None = None

    @property
    def direct(self) -> tuple[str, dict[str, str]]:
        return f"{self.endpoint}/v1/chat/completions", {"Authorization": f"Bearer {self.key}"}

    @property
    def via(self) -> tuple[str, dict[str, str]]:
        return f"{self.gateway_url}/v1/chat/completions", {}

    @property
    def floor(self) -> tuple[str, dict[str, str]]:
        assert self.floor_url is not None, "one_host_grid(floor=True) starts the floor gateway"
        return f"{self.floor_url}/v1/chat/completions", {}


@contextlib.asynccontextmanager
async def one_host_grid(*, threads: int, slots: int = 1, context_size: int = 1024,
                        floor: bool = False) -> AsyncIterator[OneHostGrid]:
    """A real nats-server, one llama-server child (SmolLM2-135M Q4_1) with a random key only
    its host knows, the host agent's side of inference (`serve_agent`) as its own process on
    its own NATS connection, live heartbeats describing the engine, and the gateway as its own
    process (`grid.cli.main serve gateway`, default upstream backend, no engine key). Loopback.

    `floor=True` measures what the gateway costs by itself: a second gateway process
    (`serve_floor_gateway`) calls the same engine straight over HTTP with its key (upstream
    backend h1 and `KeyedEngineHop`: no agent, no NATS, no TLS). The engine is the one an agent
    starts, key and all, so the three paths (direct, floor, gateway) reach it alike."""
    from grid.agent.artifacts import ensure_bundled_model
    from grid.agent.engines.llama_cpp import EngineSpec, spawn
    from grid.agent.engines.runtime import find_runtime
    from grid.config import GridConfig
    from grid.secrets import write_owner_only

    cache = Path(os.environ.get("GRID_BENCH_CACHE", Path.home() / ".cache" / "grid-bench"))
    model_path = ensure_bundled_model(GridConfig(home=cache, nats_url=None))
    # The runtime an agent would use (xllamacpp's prebuilt server by default).
    runtime = find_runtime()
    if runtime is None:
        sys.exit("no llama.cpp runtime: pip install xllamacpp")
    binary = runtime.command
    with tempfile.TemporaryDirectory(prefix="grid-bench-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir(mode=0o700)
        host_dir = Path(tmp) / "host"
        host_dir.mkdir(mode=0o700)
        nats = EmbeddedNats(Path(tmp) / "nats").start()
        engine = agent = gateway = floor_gateway = None
        floor_url: str | None = None
        heartbeat_task: asyncio.Task[None] | None = None
        stop = asyncio.Event()
        log: JetStreamLog | None = None
        try:
            log = await JetStreamLog.connect(nats.url)
            key = secrets.token_hex(32)  # the host's own key: the gateway's process never sees it
            key_file = host_dir / "engine.key"
            write_owner_only(key_file, (key + "\n").encode())
            spec = EngineSpec(model_id=MODEL_ID, model_path=model_path, port=free_port(), key_file=key_file,
                              slots=slots, context_size=context_size, threads=threads)
            engine = spawn(binary, spec, Path(tmp) / "llama.log")
            await wait_http(f"{spec.endpoint}/health")
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
            agent = subprocess.Popen(
                [sys.executable, "-m", "bench._common", "serve-agent", nats.url, spec.endpoint, str(key_file)],
                env=env, stdout=subprocess.PIPE, stderr=open(Path(tmp) / "agent.log", "wb"),
            )
            assert agent.stdout is not None
            if agent.stdout.readline().strip() != b"serving":
                raise RuntimeError((Path(tmp) / "agent.log").read_text()[-2000:])
            heartbeat_task = asyncio.create_task(heartbeats(log, spec.endpoint, slots, stop))
            gateway, gw_url = await _gateway(env, home, nats.url, Path(tmp) / "gateway.log")
            if floor:
                floor_home = Path(tmp) / "floor-home"
                floor_home.mkdir(mode=0o700)
                floor_log = Path(tmp) / "floor-gateway.log"
                floor_gateway, floor_url = await asyncio.to_thread(
                    start_floor_gateway, nats.url, key_file, dict(env, GRID_HOME=str(floor_home)), floor_log)
            procs = {"gateway": psutil.Process(gateway.pid), "nats-server": psutil.Process(nats.process.pid),
                     "host agent": psutil.Process(agent.pid), "engine": psutil.Process(engine.pid)}
            if floor_gateway is not None:
                procs["floor gateway"] = psutil.Process(floor_gateway.pid)
            yield OneHostGrid(spec.endpoint, key, gw_url, procs, floor_url)
        finally:
            stop.set()
            if heartbeat_task is not None:
                heartbeat_task.cancel()
            for proc in (floor_gateway, gateway, agent, engine):
                stop_process(proc)
            if log is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(log.close(), 5.0)
            nats.stop()


async def _gateway(env: dict[str, str], home: Path, nats_url: str,
                   log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A gateway process with default settings, once it lists the model."""
    port = free_port()
    gw_env = {k: v for k, v in env.items() if not k.startswith("GRID_GATEWAY_")}  # the defaults
    gw_env.update(GRID_HOME=str(home), GRID_NATS_URL=nats_url)
    gateway = subprocess.Popen([sys.executable, "-m", "grid.cli.main", "serve", "gateway", "--port", str(port)],
                               env=gw_env, stdout=subprocess.DEVNULL, stderr=open(log_path, "wb"))
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_http(f"{url}/gateway/health")
        await wait_listed(url, log_path=log_path, timeout=30.0)
    except BaseException:
        stop_process(gateway)
        raise
    return gateway, url


async def interleaved(paths: dict[str, tuple[str, dict[str, str]]], *, rounds: int, warmup: int,
                      procs: dict[str, psutil.Process], meter: CpuMeter | None = None,
                      ) -> tuple[dict[str, dict[str, list[float]]], dict[str, float]]:
    """`rounds` interleaved rounds over two paths (order alternates each round), one keep-alive
    client per path: a non-streaming max_tokens=1 chat ("plain") and a stream's time to first
    token ("ttft") each. Returns the latencies and each process's CPU ms per request of one
    path (user + system over the measured rounds / (2 * rounds)); `meter`, when given, measures
    the idle rates after the warmup and holds the rounds' figures gross and net of them."""
    names = list(paths)
    results: dict[str, dict[str, list[float]]] = {"plain": {n: [] for n in names}, "ttft": {n: [] for n in names}}
    async with contextlib.AsyncExitStack() as stack:
        clients = {n: (await stack.enter_async_context(httpx.AsyncClient(trust_env=False, timeout=60.0)), *paths[n])
                   for n in names}
        for _ in range(warmup):
            for c, url, h in clients.values():
                await one_plain(c, url, h)
                await one_ttft(c, url, h)
        if meter is not None:
            await meter.idle()
            meter.start()
        before = {n: cpu_seconds(p) for n, p in procs.items()}
        for i in range(rounds):
            order = names if i % 2 == 0 else names[::-1]
            for name in order:
                results["plain"][name].append(await one_plain(*clients[name]))
            for name in order:
                results["ttft"][name].append(await one_ttft(*clients[name]))
        if meter is not None:
            meter.stop(2 * rounds)
        cpu_ms = {n: (cpu_seconds(p) - before[n]) * 1e3 / (2 * rounds) for n, p in procs.items()}
    return results, cpu_ms


@contextlib.asynccontextmanager
async def overhead_rounds(other: str, *, rounds: int, threads: int, warmup: int) -> AsyncIterator[
        tuple[OneHostGrid, dict[str, dict[str, list[float]]], dict[str, float]]]:
    """`interleaved` rounds "direct" against `other` (through the gateway) on a `one_host_grid`,
    with the CPU of the added path's processes; the grid still runs inside the block."""
    async with one_host_grid(threads=threads) as grid:
        procs = {n: p for n, p in grid.procs.items() if n != "engine"}
        results, cpu_ms = await interleaved({"direct": grid.direct, other: grid.via}, rounds=rounds,
                                            warmup=warmup, procs=procs)
        yield grid, results, cpu_ms


def overhead_args(doc: str | None) -> Any:
    """The command line of the overhead benches: --rounds, --warmup, --threads (bounded)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200, help="interleaved measured rounds")
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured rounds first")
    parser.add_argument("--threads", type=int, default=1, help="llama-server threads (2 cores here)")
    parser.add_argument("--idle-seconds", type=float, default=10.0,
                        help="how long each process's idle CPU rate is measured first (benches that report CPU "
                             "net of it; 0: not measured)")
    args = parser.parse_args()
    args.rounds, args.warmup = max(1, args.rounds), max(0, args.warmup)
    return args


def print_latency_table(results: dict[str, dict[str, list[float]]], base: str, other: str) -> float:
    """Median and p99 of both paths, added ms and ratio; returns the median added (plain) in ms."""
    print(f"{'measure':<28}{base + ' ms':>12}{other + ' ms':>12}{'added ms':>10}{'ratio':>8}")
    for name, label in (("plain", "max_tokens=1 latency"), ("ttft", "stream first token")):
        d, g = results[name][base], results[name][other]
        for q, qn in ((0.5, "median"), (0.99, "p99")):
            dq, gq = pct(d, q) * 1e3, pct(g, q) * 1e3
            print(f"{label + ' ' + qn:<28}{dq:>12.2f}{gq:>12.2f}{gq - dq:>10.2f}{gq / dq:>8.3f}")
    return (pct(results["plain"][other], 0.5) - pct(results["plain"][base], 0.5)) * 1e3


if __name__ == "__main__":
    from grid import eventloop

    if len(sys.argv) == 5 and sys.argv[1] == "serve-agent":
        eventloop.run(serve_agent(sys.argv[2], sys.argv[3], Path(sys.argv[4])))  # the agent's own loop
    elif len(sys.argv) == 5 and sys.argv[1] == "serve-floor-gateway":
        eventloop.run(serve_floor_gateway(sys.argv[2], Path(sys.argv[3]), sys.argv[4]))  # the gateway's own loop
    else:
        sys.exit("usage: python -m bench._common serve-agent NATS_URL ENDPOINT KEY_FILE\n"
                 "       python -m bench._common serve-floor-gateway NATS_URL KEY_FILE MODEL")


class ChatLoad:
    """Steady chat load through a gateway: `clients` clients, each sending the next request as
    soon as the last one ended (short answers). Every request is recorded as (start, end, status):
    598 a transport error, 599 a stream cut before its end."""

    def __init__(self, gateway_url: str, model: str, clients: int, *, max_tokens: int = 4,
                 timeout: float = 120.0) -> None:
        self.url = f"{gateway_url}/v1/chat/completions"
        self.model, self.clients, self.max_tokens, self.timeout = model, clients, max_tokens, timeout
        self.results: list[tuple[float, float, int]] = []

    async def _client(self, n: int, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=self.timeout) as client:
            i = 0
            while not stop.is_set():
                stream = (n + i) % 2 == 1  # streamed and not, alternately
                body = {"model": self.model, "messages": [{"role": "user", "content": "Reply with OK"}],
                        "max_tokens": self.max_tokens, "stream": stream}
                start = time.monotonic()
                try:
                    async with client.stream("POST", self.url, json=body) as r:
                        content = await r.aread()
                        status = 599 if r.status_code == 200 and stream and b"[DONE]" not in content else r.status_code
                except httpx.HTTPError:
                    status = 598
                self.results.append((start, time.monotonic(), status))
                i += 1
                if status != 200:
                    await asyncio.sleep(0.1)  # a failing gateway answers at once: do not spin

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.gather(*(self._client(n, stop) for n in range(self.clients)))

    def window(self, start: float, end: float) -> "LoadWindow":
        """What the clients saw between `start` and `end` (requests that ended in it)."""
        inside = [(s, e, status) for s, e, status in self.results if start <= e <= end]
        ok = sorted(e for _, e, status in inside if status == 200)
        # The longest wait for a success, from the window's start to its end.
        marks = [start, *ok, end]
        gap = max(b - a for a, b in zip(marks, marks[1:])) if len(marks) > 1 else end - start
        return LoadWindow(sent=len(inside), failed=sum(1 for *_, status in inside if status != 200),
                          longest_gap=gap, seconds=end - start, statuses=sorted({s for *_, s in inside if s != 200}))


@dataclass
class LoadWindow:
    sent: int
    failed: int
    longest_gap: float  # seconds without a success
    seconds: float
    statuses: list[int]

    @property
    def success_rate(self) -> float:
        """Successful requests per second."""
        return (self.sent - self.failed) / self.seconds if self.seconds else 0.0


def gateway_active(gateway_url: str) -> int:
    """Requests the gateway holds a slot for (`/gateway/stats`), summed over its routes."""
    stats = httpx.get(f"{gateway_url}/gateway/stats", timeout=5).json()
    return sum(int(r.get("active", 0)) for r in stats.get("routes") or [])


def slots_released(gateway_url: str, within: float) -> tuple[float | None, int]:
    """(seconds until the gateway holds no slot, or None; slots still held after `within`)."""
    start = time.monotonic()
    active = -1
    while time.monotonic() - start < within:
        try:
            active = gateway_active(gateway_url)
        except (httpx.HTTPError, ValueError):
            active = -1
        if active == 0:
            return time.monotonic() - start, 0
        time.sleep(0.2)
    return None, active


def seed_fleet_models(root: Path) -> None:
    """A test fleet's model cache under `root` from the bench cache (GRID_BENCH_CACHE): hard
    links, so no download and no second copy (the bundled model is verified once, shared by the
    benches)."""
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
