"""The private upstream hop: one shared keep-alive connection pool and the per-host engine keys.

Client headers are never copied wholesale: only content negotiation goes upstream, and the
`Authorization` header is always Grid's derived engine key for the chosen host (any client
Authorization and the X-Grid-Affinity-Key are dropped). Engine keys are derived on demand from
the fleet engine secret, cached in memory, and never logged or put in events.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol

import httpx

from grid.gateway.h1 import H1Pool, Target
from grid.secrets import ENGINE_SECRET_FILE, engine_key, load_or_create_secret

# Response headers that describe the hop, not the content.
HOP_HEADERS = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
    b"transfer-encoding", b"upgrade", b"content-length", b"server", b"date",
    b"access-control-allow-origin", b"access-control-allow-credentials", b"www-authenticate",
})


BACKENDS = ("h1", "httpx")
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

    async def post(self, target: Target, body: bytes, headers: list[tuple[bytes, bytes]]) -> UpstreamResponse: ...

    async def aclose(self) -> None: ...


class _HttpxResponse:
    """An httpx response seen through `UpstreamResponse`."""

    __slots__ = ("_response",)

    def __init__(self, response: httpx.Response) -> None:
        self._response = response

    @property
    def status_code(self) -> int:
        return self._response.status_code

    @property
    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        return self._response.headers.raw

    def aiter_raw(self) -> AsyncIterator[bytes]:
        return self._response.aiter_raw()

    async def aread(self) -> bytes:
        return await self._response.aread()

    async def aclose(self) -> None:
        await self._response.aclose()


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
    """The shared keep-alive connection pool for the private hop, and its parsed targets.

    Default backend "h1" is grid.gateway.h1 (see there for why and by how much); "httpx" is
    `HttpxClient`. Both satisfy `UpstreamClient`.
    """

    def __init__(
        self,
        *,
        connect_timeout: float = 5.0,
        read_timeout: float = 600.0,
        max_connections: int = 512,
        backend: str = "h1",
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown upstream backend {backend!r} ({' or '.join(BACKENDS)})")
        self.backend = backend
        self.client: UpstreamClient
        if backend == "h1":
            self.client = H1Pool(connect_timeout=connect_timeout, read_timeout=read_timeout)
        else:
            self.client = HttpxClient(connect_timeout=connect_timeout, read_timeout=read_timeout,
                                      max_connections=max_connections)
        self._targets: dict[tuple[str, str], Target] = {}

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

    async def post(self, target: Target, body: bytes, headers: list[tuple[bytes, bytes]]) -> UpstreamResponse:
        return await self.client.post(target, body, headers)

    async def aclose(self) -> None:
        await self.client.aclose()


class EngineKeys:
    def __init__(self, home: Path) -> None:
        self._secret = load_or_create_secret(home / ENGINE_SECRET_FILE)
        self._headers: dict[str, bytes] = {}

    def authorization(self, host_id: str) -> bytes:
        """`Bearer <engine key>` for one host, as header bytes (cached)."""
        value = self._headers.get(host_id)
        if value is None:
            value = f"Bearer {engine_key(self._secret, host_id)}".encode()
            self._headers[host_id] = value
        return value

    def __repr__(self) -> str:  # never print the secret
        return f"EngineKeys(hosts={len(self._headers)})"


def response_headers(upstream: UpstreamResponse) -> list[tuple[bytes, bytes]]:
    return [(k.lower(), v) for k, v in upstream.raw_headers if k.lower() not in HOP_HEADERS]
