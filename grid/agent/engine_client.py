"""The agent's client for its own loopback engines when it forwards inference from NATS.

`grid.gateway.h1` is the small HTTP/1.1 client measured for exactly this hop (one POST of a
JSON body to a llama-server, a Content-Length or SSE answer): about 120 us of CPU per pooled
request against about 600 us through an httpx transport (see that module). Every forwarded
request pays it once on the engine's host.
"""

from __future__ import annotations

from grid.gateway.h1 import H1Pool, H1Response, Target

MAX_TARGETS = 1024


class H1EngineClient:
    """`grid.infer.responder.EngineClient` on an `H1Pool` (never replays a POST)."""

    def __init__(self, *, connect_timeout: float = 5.0, read_timeout: float = 600.0) -> None:
        self._pool = H1Pool(connect_timeout=connect_timeout, read_timeout=read_timeout)
        self._targets: dict[str, Target] = {}

    async def post(self, url: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> H1Response:
        target = self._targets.get(url)
        if target is None:
            if len(self._targets) >= MAX_TARGETS:  # engine ports change as models come and go
                self._targets.clear()
            target = self._targets[url] = Target(url)
        return await self._pool.post(target, body, headers)

    async def aclose(self) -> None:
        await self._pool.aclose()
