"""The private upstream hop: one shared keep-alive httpx client and the per-host engine keys.

Client headers are never copied wholesale: only content negotiation goes upstream, and the
`Authorization` header is always Grid's derived engine key for the chosen host (any client
Authorization and the X-Grid-Affinity-Key are dropped). Engine keys are derived on demand from
the fleet engine secret, cached in memory, and never logged or put in events.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from grid.secrets import ENGINE_SECRET_FILE, engine_key, load_or_create_secret

# Response headers that describe the hop, not the content.
HOP_HEADERS = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
    b"transfer-encoding", b"upgrade", b"content-length", b"server", b"date",
    b"access-control-allow-origin", b"access-control-allow-credentials", b"www-authenticate",
})


def make_client(
    *, connect_timeout: float = 5.0, read_timeout: float = 600.0, max_connections: int = 512
) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        timeout=httpx.Timeout(connect=connect_timeout, read=read_timeout, write=30.0, pool=30.0),
        limits=httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections, keepalive_expiry=60.0
        ),
        trust_env=False,  # never route the private hop through an environment proxy
        follow_redirects=False,
    )


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


def response_headers(upstream: httpx.Response) -> list[tuple[bytes, bytes]]:
    return [(k.lower(), v) for k, v in upstream.headers.raw if k.lower() not in HOP_HEADERS]
