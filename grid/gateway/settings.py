"""Gateway settings, read from an explicit environment mapping.

GRID_GATEWAY_API_KEYS     a file (one key per line, '#' comments) or a comma-separated list;
                          unset or empty: no client keys required
GRID_GATEWAY_MAX_BODY     request body limit in bytes (default 4 MiB)
GRID_GATEWAY_QUEUE_SECONDS  how long a request may wait for a free slot (default 30)
GRID_GATEWAY_BODY_SECONDS   how long a request body may take to arrive (default 10)
GRID_GATEWAY_MAX_INCOMPLETE how many request bodies may be arriving at once (default 128)
GRID_GATEWAY_UPSTREAM     upstream client: nats (default, through the host's agent), or h1 / httpx (keyless engines only)
GRID_GATEWAY_INSECURE     1: allow listening beyond loopback without client keys (as --insecure)
GRID_HTTP_*               connection limits of its listener (header time, keep-alive, connections,
                          head size), as for every Grid listener: see grid.http_limits
GRID_GATEWAY_OWNER_TOKEN_FILE  the owner (operator) token that may mark evaluation traffic
                          (default GRID_HOME/operator.token; see grid.gateway.evaluation)
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from grid.gateway.routing import RoutingPolicy
from grid.http_limits import ListenerLimits
from grid.netaddr import is_loopback

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
API_KEYS_ENV = "GRID_GATEWAY_API_KEYS"
INSECURE_ENV = "GRID_GATEWAY_INSECURE"
URL_FILE = "gateway.url"


@dataclass(frozen=True)
class GatewaySettings:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # Waiting for a free slot when every ready route is at its concurrency limit.
    queue_timeout_seconds: float = 30.0
    max_waiters: int = 1024
    # Request bodies still arriving: each bounded in time, and bounded in number.
    body_timeout_seconds: float = 10.0
    max_incomplete_bodies: int = 128
    telemetry_batch_size: int = 256
    telemetry_flush_seconds: float = 1.0
    telemetry_max_queue: int = 8192
    upstream_connect_timeout: float = 5.0
    upstream_read_timeout: float = 600.0
    upstream_max_connections: int = 512
    # Retry-After for a configured model with no ready replica (its cold start, else this).
    unavailable_retry_seconds: float = 10.0
    # "nats" (through the chosen host's agent, grid.infer), or the HTTP pools "h1" / "httpx"
    # straight to a keyless engine's URL (grid.gateway.upstream says why they remain).
    upstream_backend: str = "nats"
    # Listening beyond loopback without client keys is refused unless this is set.
    insecure: bool = False
    policy: RoutingPolicy = field(default_factory=RoutingPolicy)
    # Header time, keep-alive, connections and head size of the gateway's listener.
    listener: ListenerLimits = field(default_factory=ListenerLimits)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> GatewaySettings:
        env = os.environ if environ is None else environ
        kwargs: dict[str, object] = {}
        if env.get("GRID_GATEWAY_MAX_BODY"):
            kwargs["max_body_bytes"] = max(1024, int(env["GRID_GATEWAY_MAX_BODY"]))
        if env.get("GRID_GATEWAY_QUEUE_SECONDS"):
            kwargs["queue_timeout_seconds"] = max(0.0, float(env["GRID_GATEWAY_QUEUE_SECONDS"]))
        if env.get("GRID_GATEWAY_BODY_SECONDS"):
            kwargs["body_timeout_seconds"] = max(0.1, float(env["GRID_GATEWAY_BODY_SECONDS"]))
        if env.get("GRID_GATEWAY_MAX_INCOMPLETE"):
            kwargs["max_incomplete_bodies"] = max(1, int(env["GRID_GATEWAY_MAX_INCOMPLETE"]))
        if env.get("GRID_GATEWAY_UPSTREAM"):
            kwargs["upstream_backend"] = env["GRID_GATEWAY_UPSTREAM"].strip().lower()
        if env.get(INSECURE_ENV, "").strip().lower() in ("1", "true", "yes"):
            kwargs["insecure"] = True
        kwargs["listener"] = ListenerLimits.from_environ(env)
        return cls(**kwargs)  # type: ignore[arg-type]


def exposure_error(host: str, *, keys_required: bool, insecure: bool) -> str | None:
    """Why the gateway must not listen on `host`, or None. An open gateway beyond loopback lets
    anyone who can reach it spend this grid's machines."""
    if keys_required or insecure or is_loopback(host):
        return None
    return (f"refusing to serve the gateway on {host} without client keys: set {API_KEYS_ENV} "
            f"(a key file, or comma-separated keys) or pass --insecure ({INSECURE_ENV}=1) to run it open")


class ApiKeys:
    """Client API keys, held only as sha256 digests; lookup is a set membership of digests."""

    def __init__(self, keys: Iterable[str] = ()) -> None:
        self._digests = frozenset(hashlib.sha256(k.encode()).digest() for k in keys if k)

    @property
    def required(self) -> bool:
        return bool(self._digests)

    def __len__(self) -> int:
        return len(self._digests)

    def check(self, authorization: str | None) -> bool:
        if not self._digests:
            return True
        if not authorization:
            return False
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return False
        token = token.strip()
        return bool(token) and hashlib.sha256(token.encode()).digest() in self._digests


def parse_api_keys(value: str | None) -> list[str]:
    """A path to a key file, or a comma-separated list of keys."""
    if not value or not value.strip():
        return []
    value = value.strip()
    path = Path(value).expanduser()
    looks_like_path = os.sep in value or value.startswith((".", "~"))
    if looks_like_path or path.is_file():
        if not path.is_file():
            raise ValueError(f"{API_KEYS_ENV} names {path}, which is not a file")
        keys = []
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                keys.append(line)
        return keys
    return [k.strip() for k in value.split(",") if k.strip()]
