"""Serve an ASGI app inside the caller's event loop (the admin API, the dashboard).

Components of `gridctl up` share one process and one loop; each HTTP listener is a uvicorn
server task started here, returned once it accepts connections, with the port it really bound
(port 0 asks the kernel for a free one, which avoids a probe-then-bind race).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

import uvicorn

from grid.http_limits import ListenerLimits, uvicorn_options


@dataclass
class RunningServer:
    server: uvicorn.Server
    task: asyncio.Task[Any]
    host: str
    port: int

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else "::1" if self.host == "::" else self.host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    async def stop(self, timeout: float = 5.0) -> None:
        self.server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError, Exception):
            await asyncio.wait_for(self.task, timeout)


async def serve(app: Any, host: str = "127.0.0.1", port: int = 0, *, name: str = "grid-http",
                limits: ListenerLimits | None = None) -> RunningServer:
    """Start `app` on host:port in this loop; raise the startup error if it cannot listen.
    `limits`: connection limits (grid.http_limits; default from the environment)."""
    config = uvicorn.Config(app, host=host, port=port, lifespan="off", log_level="warning", access_log=False,
                            log_config=None, server_header=False, proxy_headers=False, **uvicorn_options(limits))
    server = uvicorn.Server(config)
    # uvicorn installs signal handlers only when it owns the loop; this server is a guest.
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.get_running_loop().create_task(server.serve(), name=name)
    bound = await listening_port(server, task, port)
    if bound is None:
        exc = task.exception() if not task.cancelled() else None
        raise OSError(f"could not listen on {host}:{port}" + (f": {exc}" if exc else ""))
    return RunningServer(server, task, host, bound)


async def listening_port(server: uvicorn.Server, task: asyncio.Task[Any], port: int) -> int | None:
    """Once `server` (run by `task`) accepts connections, the port it bound: `port`, or the
    kernel's choice for port 0. None: `task` ended first (it could not listen)."""
    while not server.started:
        if task.done():
            return None
        await asyncio.sleep(0.01)
    for srv in server.servers:
        for sock in srv.sockets:
            return int(sock.getsockname()[1])
    return port
