"""The private upstream hop: one shared keep-alive connection pool and the per-host engine keys.

Client headers are never copied wholesale: only content negotiation goes upstream, and the
`Authorization` header is always Grid's derived engine key for the chosen host (any client
Authorization and the X-Grid-Affinity-Key are dropped). Engine keys are derived on demand from
the fleet engine secret, cached in memory, and never logged or put in events.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from grid.gateway.h1 import H1Pool, Target
from grid.secrets import ENGINE_SECRET_FILE, engine_key, load_or_create_secret

# Response headers that describe the hop, not the content.
HOP_HEADERS = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
    b"transfer-encoding", b"upgrade", b"content-length", b"server", b"date",
    b"access-control-allow-origin", b"access-control-allow-credentials", b"www-authenticate",
})


class Upstream:
    """The shared keep-alive connection pool for the private hop.

    Default backend "h1" is grid.gateway.h1 (see there for why); "httpx" calls a shared httpx
    transport directly with a pre-parsed URL (the AsyncClient layers above it do nothing for
    this hop). Both return responses with `status_code`, `aiter_raw()`, `aread()`, `aclose()`
    and raise httpx exceptions.
    """

    def __init__(
        self,
        *,
        connect_timeout: float = 5.0,
        read_timeout: float = 600.0,
        max_connections: int = 512,
        backend: str = "h1",
    ) -> None:
        if backend not in ("h1", "httpx"):
            raise ValueError(f"unknown upstream backend {backend!r} (h1 or httpx)")
        self.backend = backend
        self._targets: dict[tuple[str, str], object] = {}
        self.pool = H1Pool(connect_timeout=connect_timeout, read_timeout=read_timeout)
        self.transport = httpx.AsyncHTTPTransport(
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections, keepalive_expiry=4.0
            ),
            retries=0,  # a failed POST is never replayed
        )
        timeout = httpx.Timeout(connect=connect_timeout, read=read_timeout, write=30.0, pool=30.0)
        self._extensions = {"timeout": timeout.as_dict()}

    def target(self, endpoint: str, path: str) -> object:
        key = (endpoint, path)
        target = self._targets.get(key)
        if target is None:
            base = endpoint.rstrip("/")
            if base.endswith("/v1") and path.startswith("/v1/"):
                base = base[:-3]
            target = Target(base + path) if self.backend == "h1" else httpx.URL(base + path)
            if isinstance(target, httpx.URL) and (target.scheme not in ("http", "https") or not target.host):
                raise httpx.InvalidURL(f"not an http(s) engine endpoint: {endpoint!r}")
            if len(self._targets) >= 4096:
                self._targets.clear()
            self._targets[key] = target
        return target

    async def post(self, target: object, body: bytes, headers: list[tuple[bytes, bytes]]) -> Any:
        if isinstance(target, Target):
            return await self.pool.post(target, body, headers)
        request = httpx.Request("POST", target, content=body, headers=headers,  # type: ignore[arg-type]
                                extensions=self._extensions)
        return await self.transport.handle_async_request(request)

    async def aclose(self) -> None:
        await self.pool.aclose()
        await self.transport.aclose()


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


def response_headers(upstream: Any) -> list[tuple[bytes, bytes]]:
    raw = upstream.raw_headers if hasattr(upstream, "raw_headers") else upstream.headers.raw
    return [(k.lower(), v) for k, v in raw if k.lower() not in HOP_HEADERS]
