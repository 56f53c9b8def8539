"""The gateway's Starlette app and its server: composition and serving, no request logic.

`create_gateway_app` composes the process state (`grid.gateway.state.Gateway`) with the HTTP
handlers (`grid.gateway.routes`); neither of those imports the other's module back.

Public entry points for `gridctl up` and `gridctl serve gateway`:

    app = create_gateway_app(log, config, api_keys=None, clock=None)
    await serve_gateway(app, "127.0.0.1", 8000)         # runs until cancelled
    running = await start_gateway(app, "127.0.0.1", 0)  # or: start, read running.url, stop
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any

import structlog
import uvicorn
from starlette.applications import Starlette

from grid.clock import Clock
from grid.config import GridConfig
from grid.events.log import EventLog
from grid.gateway.responses import SOCKET_SCOPE_KEY
from grid.gateway.routes import build_routes, exception_handlers
from grid.gateway.settings import URL_FILE, GatewaySettings, exposure_error
from grid.gateway.state import Gateway
from grid.infer.local import LocalResponders
from grid.http_limits import uvicorn_options
from grid.serving import listening_port
from grid.tasks import cancel_and_wait

log = structlog.get_logger(__name__)


def create_gateway_app(
    log: EventLog,
    config: GridConfig,
    *,
    api_keys: Iterable[str] | None = None,
    clock: Clock | None = None,
    settings: GatewaySettings | None = None,
    environ: Mapping[str, str] | None = None,
    local_responders: LocalResponders | None = None,
) -> Starlette:
    """The OpenAI-compatible gateway app. Its lifespan starts/stops the follower and flusher.

    `api_keys`: client keys to require; None reads GRID_GATEWAY_API_KEYS (file or list) from
    `environ` (default os.environ); empty means no client key is required.
    `local_responders`: host agents in this process, whose requests skip NATS (grid.infer.local).

    Every request, inference included, goes through Starlette's middleware stack and router.
    An earlier version dispatched the three inference paths straight from `__call__`; measured
    in-process (ASGI calls of a refused chat request, 2-core machine under load) the stack
    costs about 20 us per request (26 -> 48 us), 1% of the gateway's 2 ms budget: not worth a
    second dispatch path.
    """
    gateway = Gateway(log, config, api_keys=api_keys, clock=clock, settings=settings, environ=environ,
                      local_responders=local_responders)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    app = Starlette(routes=build_routes(), exception_handlers=exception_handlers(), lifespan=lifespan)
    app.state.gateway = gateway
    return app


# --- serving -----------------------------------------------------------------------------------


def expose_client_socket(app: Any) -> Any:
    """The ASGI app uvicorn calls: puts the client connection's socket in each HTTP scope
    (`SOCKET_SCOPE_KEY`), from uvicorn's own `send`, so a response can cork its head and body
    into one transmission (grid.gateway.responses). Nothing else reads it."""

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            transport = getattr(getattr(send, "__self__", None), "transport", None)
            if transport is not None:
                scope[SOCKET_SCOPE_KEY] = transport.get_extra_info("socket")
        await app(scope, receive, send)

    return asgi


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
            await cancel_and_wait([self.task])
        if self.url_file is not None:
            with contextlib.suppress(OSError):
                if self.url_file.read_text().strip() == self.url:
                    self.url_file.unlink()


class GatewayExposureError(RuntimeError):
    """Asked to listen beyond loopback with no client keys and no --insecure."""


async def start_gateway(app: Starlette, host: str = "127.0.0.1", port: int = 0, *,
                        write_url_file: bool = True, insecure: bool = False) -> RunningGateway:
    """Serve `app` in this event loop; returns once it accepts connections (port 0 = free port).

    Writes GRID_HOME/gateway.url (for `gridctl models` / `gridctl chat`) unless told not to.
    Raises GatewayExposureError, before binding, for a non-loopback `host` without client keys
    unless `insecure` (or the settings' GRID_GATEWAY_INSECURE).
    """
    gw: Gateway = app.state.gateway
    refusal = exposure_error(host, keys_required=gw.api_keys.required, insecure=insecure or gw.settings.insecure)
    if refusal is not None:
        raise GatewayExposureError(refusal)
    config = uvicorn.Config(
        expose_client_socket(app), host=host, port=port, lifespan="on", log_level="warning", access_log=False,
        log_config=None, server_header=False, date_header=False, proxy_headers=False,
        **uvicorn_options(gw.settings.listener),
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(), name="grid-gateway-server")
    bound = await listening_port(server, task, port)
    if bound is None:
        task.result()  # raises the startup error
        raise RuntimeError("gateway server exited during startup")
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
