"""The private upstream hop: how the proxy reaches the engine it chose.

Default backend "nats": the request travels over NATS to the chosen host's agent
(grid.infer), which adds that host's engine key and forwards it to its loopback engine. The
gateway holds no engine key and needs no route to the engine: a host behind NAT serves too.

Backends "h1" and "httpx" are HTTP pools to an engine's advertised URL, kept for the pools' own
tests and benchmarks against engines that take no key: the gateway never holds engine keys, so
they cannot reach an engine an agent spawned (those accept only their host's key). The one
exception is a bench's, not a user's: the floor gateway of bench.gateway_floor and
bench.remote_overhead wraps the h1 client in one that adds the engine's key, as the agent does.

Client headers are never copied wholesale: only content negotiation goes upstream (any client
Authorization and the X-Grid-Affinity-Key are dropped).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

import httpx

from grid.infer.client import InferTarget, NatsUpstream
from grid.infer.responder import HttpxEngineResponse
from grid.transport.h1 import H1Pool, Target

# Response headers that describe the hop, not the content.
HOP_HEADERS = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
    b"transfer-encoding", b"upgrade", b"content-length", b"server", b"date",
    b"access-control-allow-origin", b"access-control-allow-credentials", b"www-authenticate",
})


BACKENDS = ("nats", "h1", "httpx")
MAX_TARGETS = 4096


class UpstreamResponse(Protocol):
    """What the proxy reads from an engine's answer, whichever client fetched it."""

    @property
    def status_code(self) -> int: ...

    @property
    def raw_headers(self) -> list[tuple[bytes, bytes]]: ...

    def aiter_raw(self) -> AsyncIterator[bytes]: ...

    async def aread(self) -> bytes: ...

    async def aclose(self) -> None: ...


class UpstreamClient(Protocol):
    """The seam between the proxy and the wire: POST once, never replayed.

    Failures raise httpx exceptions (TimeoutException, TransportError, ...) from either client.
    """

    async def post(self, target: Any, body: bytes, headers: list[tuple[bytes, bytes]]) -> UpstreamResponse: ...

    async def aclose(self) -> None: ...


class _HttpxResponse(HttpxEngineResponse):
    """An httpx response seen through `UpstreamResponse`."""

    __slots__ = ()

    async def aread(self) -> bytes:
        return await self._response.aread()


class HttpxClient:
    """The private hop on a shared httpx transport (the AsyncClient layers above it do nothing
    for this hop, so requests go to the transport directly)."""

    def __init__(self, *, connect_timeout: float, read_timeout: float, max_connections: int) -> None:
        self.transport = httpx.AsyncHTTPTransport(
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections, keepalive_expiry=4.0
            ),
            retries=0,  # a failed POST is never replayed
        )
        timeout = httpx.Timeout(connect=connect_timeout, read=read_timeout, write=30.0, pool=30.0)
        self._extensions = {"timeout": timeout.as_dict()}
        self._urls: dict[str, httpx.URL] = {}

    async def post(self, target: Target, body: bytes, headers: list[tuple[bytes, bytes]]) -> UpstreamResponse:
        url = self._urls.get(target.url)
        if url is None:
            if len(self._urls) >= MAX_TARGETS:
                self._urls.clear()
            url = self._urls[target.url] = httpx.URL(target.url)
        request = httpx.Request("POST", url, content=body, headers=headers, extensions=self._extensions)
        return _HttpxResponse(await self.transport.handle_async_request(request))

    async def aclose(self) -> None:
        await self.transport.aclose()


class Upstream:
    """The proxy's one upstream client and its cached targets.

    Default backend "nats" is `grid.infer.client.NatsUpstream` on the gateway's NATS connection
    (`nc`; None, as with the in-memory log, answers every request with a connect error), signing
    each request as `signer` (the log's authorship; None without identities), handing it to the
    chosen host's responder directly when that runs in this process (`local`,
    grid.infer.local.LocalResponders). "h1"
    is grid.transport.h1 (see there for why and by how much); "httpx" is `HttpxClient`. All
    satisfy `UpstreamClient`.
    """

    def __init__(
        self,
        *,
        connect_timeout: float = 5.0,
        read_timeout: float = 600.0,
        max_connections: int = 512,
        backend: str = "nats",
        nc: Any = None,
        signer: Any = None,
        local: Any = None,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown upstream backend {backend!r} ({' or '.join(BACKENDS)})")
        self.backend = backend
        self.client: UpstreamClient
        if backend == "nats":
            self.client = NatsUpstream(nc, connect_timeout=connect_timeout, read_timeout=read_timeout, signer=signer,
                                       local=local)
        elif backend == "h1":
            self.client = H1Pool(connect_timeout=connect_timeout, read_timeout=read_timeout)
        else:
            self.client = HttpxClient(connect_timeout=connect_timeout, read_timeout=read_timeout,
                                      max_connections=max_connections)
        self._targets: dict[tuple[str, str], Target] = {}
        self._infer_targets: dict[tuple[str, str, str], InferTarget] = {}

    def target(self, endpoint: str, path: str) -> Target:
        """The parsed URL of `path` on an engine endpoint (raises httpx.InvalidURL)."""
        key = (endpoint, path)
        target = self._targets.get(key)
        if target is None:
            base = endpoint.rstrip("/")
            if base.endswith("/v1") and path.startswith("/v1/"):
                base = base[:-3]
            target = Target(base + path)
            if len(self._targets) >= MAX_TARGETS:
                self._targets.clear()
            self._targets[key] = target
        return target

    def route_target(self, host_id: str, model_id: str, endpoint: str | None, path: str) -> Any:
        """Where this backend sends `path` for one route: through the host's agent (nats), or
        straight to the engine's advertised endpoint (h1, httpx)."""
        if self.backend != "nats":
            if endpoint is None:
                raise httpx.InvalidURL(f"{host_id} advertises no endpoint for {model_id}")
            return self.target(endpoint, path)
        key = (host_id, model_id, path)
        target = self._infer_targets.get(key)
        if target is None:
            target = InferTarget(host_id, model_id, path)
            if len(self._infer_targets) >= MAX_TARGETS:
                self._infer_targets.clear()
            self._infer_targets[key] = target
        return target

    async def post(self, target: Any, body: bytes, headers: list[tuple[bytes, bytes]]) -> UpstreamResponse:
        return await self.client.post(target, body, headers)

    async def aclose(self) -> None:
        await self.client.aclose()


def response_headers(upstream: UpstreamResponse) -> list[tuple[bytes, bytes]]:
    return [(k.lower(), v) for k, v in upstream.raw_headers if k.lower() not in HOP_HEADERS]
