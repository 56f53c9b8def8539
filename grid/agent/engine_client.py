"""The agent's client for its own loopback engines when it forwards inference from NATS.

`grid.transport.h1` is the small HTTP/1.1 client measured for exactly this hop (one POST of a
JSON body to a llama-server, a Content-Length or SSE answer): python -m bench.engine_hop measured
about 140 us of CPU per pooled request against a server answering at once, against about 700 us
through an httpx transport and 1,000 us through an httpx.AsyncClient, and 1.2-1.3 ms less
latency than httpx.AsyncClient per max_tokens=1 request to a real llama-server (the figures are
in grid.transport.h1). Every forwarded request pays it once on the engine's host.

A streamed request goes out with "Connection: close" (llama-server drops the connection after
a stream without saying so), so it uses up the pooled connection; the next request would pay a
TCP connect on its critical path. When such a response ends and no connection is idle, one is
opened in the background (`H1Pool.warm`): python -m bench.remote_overhead (200 rounds, plain
requests alternating with streams) measured the agent's share of a non-streamed request at
0.74 ms with the connect and 0.45 ms on a pooled connection. It holds no more engine HTTP
threads than a pooled connection left by a non-streamed request does, and only after the
stream's own connection closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from grid.tasks import cancel_and_wait
from grid.transport.h1 import H1Pool, H1Response, Target

MAX_TARGETS = 1024


class _ClosingResponse:
    """An `H1Response` whose connection ends with it; once closed, a spare is warmed."""

    __slots__ = ("_client", "_response", "_target")

    def __init__(self, client: H1EngineClient, response: H1Response, target: Target) -> None:
        self._client = client
        self._response = response
        self._target = target

    @property
    def status_code(self) -> int:
        return self._response.status_code

    @property
    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        return self._response.raw_headers

    def aiter_raw(self) -> AsyncIterator[bytes]:
        return self._response.aiter_raw()

    async def aclose(self) -> None:
        await self._response.aclose()
        self._client.warm(self._target)


class H1EngineClient:
    """`grid.infer.responder.EngineClient` on an `H1Pool` (never replays a POST)."""

    def __init__(self, *, connect_timeout: float = 5.0, read_timeout: float = 600.0) -> None:
        self._pool = H1Pool(connect_timeout=connect_timeout, read_timeout=read_timeout)
        self._targets: dict[str, Target] = {}
        self._warming: dict[tuple[str, str, int], asyncio.Task[bool]] = {}
        self._closed = False

    async def post(self, url: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> H1Response | _ClosingResponse:
        target = self._targets.get(url)
        if target is None:
            if len(self._targets) >= MAX_TARGETS:  # engine ports change as models come and go
                self._targets.clear()
            target = self._targets[url] = Target(url)
        response = await self._pool.post(target, body, headers)
        if any(name == b"connection" and value.lower() == b"close" for name, value in headers):
            return _ClosingResponse(self, response, target)
        return response

    def warm(self, target: Target) -> None:
        """Have one idle connection to `target` ready for the next request (at most one
        warm-up per engine at a time)."""
        if self._closed or target.origin in self._warming:
            return
        task = asyncio.get_running_loop().create_task(self._pool.warm(target), name="engine-warm")
        self._warming[target.origin] = task
        task.add_done_callback(lambda _t: self._warming.pop(target.origin, None))

    async def aclose(self) -> None:
        self._closed = True
        await cancel_and_wait(list(self._warming.values()))
        await self._pool.aclose()
