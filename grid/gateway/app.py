"""The gateway process state and its Starlette app.

`Gateway` owns everything with side effects at this edge: a live ProjectionRunner (fleet +
catalog) following the log, the routing table cache, the private breaker board and
measurements, the proxy-owned active counters and last_used_at watermarks, the telemetry
queue, the shared upstream httpx client and the engine keys. The pure choice is
`grid.gateway.routing.choose`.

Public entry points for `gridctl up`:

    app = create_gateway_app(log, config, api_keys=None, clock=None)
    await serve_gateway(app, "127.0.0.1", 8000)         # runs until cancelled
    running = await start_gateway(app, "127.0.0.1", 0)  # or: start, read running.url, stop
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any

import structlog
import uvicorn
from starlette.applications import Starlette

from grid.clock import Clock, SystemClock
from grid.config import GridConfig
from grid.events.control import ModelProfile
from grid.events.log import EventLog
from grid.events.subjects import HOSTS_STREAM
from grid.gateway import routing
from grid.gateway.breaker import BreakerBoard
from grid.gateway.measure import Measurements
from grid.gateway.routing import Candidate, RouteKey
from grid.gateway.settings import API_KEYS_ENV, URL_FILE, ApiKeys, GatewaySettings, parse_api_keys
from grid.gateway.telemetry import TelemetryQueue
from grid.gateway.upstream import EngineKeys, Upstream
from grid.projections import fleet
from grid.projections.runner import CATALOG, FLEET, ProjectionRunner

log = structlog.get_logger(__name__)

# The routing table is rebuilt when the projection moved, and at least this often (overrides
# can expire with time alone).
TABLE_MAX_AGE_SECONDS = 1.0
FOLLOW_RETRY_SECONDS = 1.0
MAX_REMEMBERED_ROUTES = 2048
# Startup replays at most this many recent host events (see Gateway._catch_up).
HOST_REPLAY_MAX_MESSAGES = 50_000


class Gateway:
    def __init__(
        self,
        event_log: EventLog,
        config: GridConfig,
        *,
        api_keys: Iterable[str] | None = None,
        clock: Clock | None = None,
        settings: GatewaySettings | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        self.log = event_log
        self.config = config
        self.clock = clock or SystemClock()
        self.settings = settings or GatewaySettings.from_environ(env)
        self.policy = self.settings.policy
        keys = list(api_keys) if api_keys is not None else parse_api_keys(env.get(API_KEYS_ENV))
        self.api_keys = ApiKeys(keys)
        self.runner = ProjectionRunner((CATALOG, FLEET))
        self.breakers = BreakerBoard()
        self.measurements = Measurements()
        self.active: dict[RouteKey, int] = {}
        self.served: Counter[RouteKey] = Counter()
        self.last_used: dict[str, float] = {}
        self.last_used_by_route: dict[RouteKey, float] = {}
        self.counters: Counter[str] = Counter()
        self.telemetry = TelemetryQueue(
            event_log,
            source=f"gateway:{socket.gethostname()}",
            clock=self.clock,
            batch_size=self.settings.telemetry_batch_size,
            flush_seconds=self.settings.telemetry_flush_seconds,
            max_queue=self.settings.telemetry_max_queue,
        )
        self.engine_keys = EngineKeys(config.home)
        self.upstream: Upstream | None = None
        self.waiters = 0
        self._released = asyncio.Event()
        self._version = 0
        self._table: dict[str, tuple[Candidate, ...]] = {}
        self._table_version = -1
        self._table_built_at = float("-inf")
        self._follower: asyncio.Task[None] | None = None
        self.started = False

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        await self._catch_up()
        self._version += 1
        self.upstream = Upstream(
            connect_timeout=self.settings.upstream_connect_timeout,
            read_timeout=self.settings.upstream_read_timeout,
            max_connections=self.settings.upstream_max_connections,
            backend=self.settings.upstream_backend,
        )
        self._follower = asyncio.create_task(self._follow(), name="grid-gateway-follower")
        self.telemetry.start()
        self.started = True

    async def _catch_up(self) -> None:
        """Fold the control stream completely and only the recent tail of the hosts stream.

        Routing needs each host's latest heartbeat, and only one younger than the heartbeat
        timeout counts; replaying days of heartbeats would only delay startup.
        """
        for stream in self.runner.streams:
            start = self.runner.positions.get(stream, 0) + 1
            if stream == HOSTS_STREAM:
                start = max(start, await self.log.last_sequence(stream) - HOST_REPLAY_MAX_MESSAGES + 1)
                # the live follower continues after the skipped prefix, never from its start
                self.runner.positions[stream] = max(self.runner.positions.get(stream, 0), start - 1)
            async for msg in self.log.replay(stream, start_seq=start):
                self.runner.fold(msg)

    async def stop(self) -> None:
        self.started = False
        if self._follower is not None:
            self._follower.cancel()
            # Closing subscriptions on a dead NATS connection can hang: bound it.
            with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(self._follower), 2.0)
            self._follower = None
        await self.telemetry.stop()
        if self.upstream is not None:
            await self.upstream.aclose()
            self.upstream = None

    async def _follow(self) -> None:
        while True:
            try:
                await self.runner.follow(self.log, on_fold=self._on_fold)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep following; routing uses the last state
                self.counters["follow_errors"] += 1
                log.warning("projection follower restarting", error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(FOLLOW_RETRY_SECONDS)

    def _on_fold(self, stream: str, msg: Any) -> None:
        self._version += 1
        self.pulse()

    def pulse(self) -> None:
        """Wake requests waiting for capacity (a slot freed or the fleet changed)."""
        if self.waiters:
            self._released.set()
            self._released = asyncio.Event()

    async def wait_for_change(self, timeout: float) -> None:
        event = self._released
        self.waiters += 1
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass
        finally:
            self.waiters -= 1

    # --- views -------------------------------------------------------------------------------------

    def table(self, now: float) -> dict[str, tuple[Candidate, ...]]:
        if self._table_version != self._version or now - self._table_built_at > TABLE_MAX_AGE_SECONDS \
                or now < self._table_built_at:
            self._table = routing.build_table(fleet.snapshots(self.runner["fleet"], now))
            self._table_version = self._version
            self._table_built_at = now
            self._prune_routes()
        return self._table

    def _prune_routes(self) -> None:
        """Forget idle per-route counters of engines that left the fleet (bounded memory)."""
        if len(self.served) <= MAX_REMEMBERED_ROUTES:
            return
        live = {c.key for cs in self._table.values() for c in cs}
        for key in [k for k in self.served if k not in live and not self.active.get(k)]:
            self.served.pop(key, None)
            self.active.pop(key, None)
            self.last_used_by_route.pop(key, None)

    @property
    def profiles(self) -> dict[str, ModelProfile]:
        return self.runner["catalog"].profiles  # type: ignore[no-any-return]

    def ready_models(self, now: float) -> list[str]:
        return routing.ready_models(self.table(now), now, self.policy)

    # --- proxy-owned counters --------------------------------------------------------------------

    def acquire(self, key: RouteKey, model_id: str, now: float) -> None:
        self.active[key] = self.active.get(key, 0) + 1
        self.served[key] += 1
        self.touch(key, model_id, now)

    def release(self, key: RouteKey, model_id: str, now: float) -> None:
        # Keys stay (at zero) once used: the proxy's count then overrides heartbeat counts.
        self.active[key] = max(0, self.active.get(key, 0) - 1)
        self.touch(key, model_id, now)
        self.pulse()

    def touch(self, key: RouteKey, model_id: str, now: float) -> None:
        # Monotonic watermarks: a clock step backwards never lowers them.
        if now > self.last_used.get(model_id, 0.0):
            self.last_used[model_id] = now
        if now > self.last_used_by_route.get(key, 0.0):
            self.last_used_by_route[key] = now

    def stats(self) -> dict[str, Any]:
        now = self.clock.now()
        keys = sorted(set(self.active) | set(self.served) | set(self.last_used_by_route))
        by_host: dict[str, dict[str, float]] = {}
        for (host_id, _endpoint, model_id), ts in sorted(self.last_used_by_route.items()):
            host = by_host.setdefault(host_id, {})
            host[model_id] = max(ts, host.get(model_id, 0.0))
        return {
            "now": now,
            "ready_models": self.ready_models(now),
            "routes": [
                {
                    "host_id": k[0],
                    "endpoint": k[1],
                    "model_id": k[2],
                    "active": self.active.get(k, 0),
                    "served": self.served.get(k, 0),
                    "last_used_at": self.last_used_by_route.get(k),
                    "circuit": self.breakers.state(k, now),
                }
                for k in keys
            ],
            "last_used_at": dict(sorted(self.last_used.items())),
            "last_used_at_by_host": by_host,
            "waiting": self.waiters,
            "open_circuits": sum(1 for c in self.breakers.describe(now) if c["state"] != "closed"),
            "telemetry": self.telemetry.stats(),
            "requests": dict(sorted(self.counters.items())),
            "projection": {
                "positions": dict(sorted(self.runner.positions.items())),
                "malformed": self.runner.malformed,
            },
            "api_keys_required": self.api_keys.required,
        }


def create_gateway_app(
    log: EventLog,
    config: GridConfig,
    *,
    api_keys: Iterable[str] | None = None,
    clock: Clock | None = None,
    settings: GatewaySettings | None = None,
    environ: Mapping[str, str] | None = None,
) -> Starlette:
    """The OpenAI-compatible gateway app. Its lifespan starts/stops the follower and flusher.

    `api_keys`: client keys to require; None reads GRID_GATEWAY_API_KEYS (file or list) from
    `environ` (default os.environ); empty means no client key is required.
    """
    from grid.gateway.routes import build_routes, exception_handlers

    gateway = Gateway(log, config, api_keys=api_keys, clock=clock, settings=settings, environ=environ)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    app = GatewayApp(routes=build_routes(), exception_handlers=exception_handlers(), lifespan=lifespan)
    app.state.gateway = gateway
    return app


class GatewayApp(Starlette):
    """Starlette, with the three inference routes dispatched directly (no middleware hops).

    Everything else (discovery, stats, lifespan, 404/405) goes through the normal Starlette
    stack. An unexpected exception on the fast path still becomes an OpenAI-shaped 500.
    """

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            kind = _FAST_PATHS.get(scope["path"])
            if kind is not None:
                from grid.gateway.routes import proxy_asgi

                scope["app"] = self
                await proxy_asgi(scope, receive, send, kind)
                return
        await super().__call__(scope, receive, send)


_FAST_PATHS = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/embeddings": "embeddings"}


# --- serving -----------------------------------------------------------------------------------


class _Server(uvicorn.Server):
    def capture_signals(self) -> contextlib.AbstractContextManager[None]:  # type: ignore[override]
        # The embedding process (gridctl up, tests) owns signal handling.
        return contextlib.nullcontext()


class RunningGateway:
    def __init__(self, server: _Server, task: asyncio.Task[None], host: str, port: int,
                 url_file: Path | None) -> None:
        self.server = server
        self.task = task
        self.host = host
        self.port = port
        self.url_file = url_file

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        self.server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self.task), 10.0)
        except TimeoutError:
            self.server.force_exit = True
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        if self.url_file is not None:
            with contextlib.suppress(OSError):
                if self.url_file.read_text().strip() == self.url:
                    self.url_file.unlink()


async def start_gateway(app: Starlette, host: str = "127.0.0.1", port: int = 0, *,
                        write_url_file: bool = True) -> RunningGateway:
    """Serve `app` in this event loop; returns once it accepts connections (port 0 = free port).

    Writes GRID_HOME/gateway.url (for `gridctl models` / `gridctl chat`) unless told not to.
    """
    config = uvicorn.Config(
        app, host=host, port=port, lifespan="on", log_level="warning", access_log=False, log_config=None,
        server_header=False, date_header=False, timeout_keep_alive=75, proxy_headers=False,
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(), name="grid-gateway-server")
    while not server.started:
        if task.done():
            task.result()  # raises the startup error
            raise RuntimeError("gateway server exited during startup")
        await asyncio.sleep(0.01)
    bound = port
    for srv in server.servers:
        for sock in srv.sockets:
            bound = int(sock.getsockname()[1])
            break
    url_file: Path | None = None
    gateway: Gateway = app.state.gateway
    running = RunningGateway(server, task, host if host not in ("0.0.0.0", "::") else "127.0.0.1", bound, None)
    if write_url_file:
        from grid.secrets import write_owner_only

        url_file = gateway.config.home / URL_FILE
        write_owner_only(url_file, (running.url + "\n").encode())
        running.url_file = url_file
    return running


async def serve_gateway(app: Starlette, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve until cancelled (uvicorn Server in-process), then shut down cleanly."""
    running = await start_gateway(app, host, port)
    log.info("gateway serving", url=running.url)
    try:
        await asyncio.shield(running.task)
    finally:
        await running.stop()
