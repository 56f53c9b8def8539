"""Credentials for the processes of one machine's grid (`gridctl up`), made without any step.

The authority lives under the grid home; each local process gets its own user key and creds
file there (owner-only), so `gridctl up` runs with auth on and nothing to copy. Other machines
join with an invitation instead (grid.identity.enrolment).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import msgspec

from grid.events.subjects import escape_token
from grid.identity.authority import HOST_CREDENTIAL_TTL_SECONDS, Authority
from grid.identity.creds import creds_claims
from grid.identity.permissions import Principal, Role

AUTHORITY_DIR = "identity"
CREDS_DIR = "creds"


class LocalCredentials(msgspec.Struct, frozen=True):
    controller: Path
    gateway: Path
    operator: Path
    hosts: dict[str, Path]
    server_config: Path


def authority_dir(grid_home: Path) -> Path:
    return Path(grid_home) / AUTHORITY_DIR


def local_credential(grid_home: Path, name: str) -> Path | None:
    """The creds file `ensure_local_credentials` made for `name` (controller, gateway, operator,
    host-<id>) under `grid_home`, or None when this grid home has no authority (auth off)."""
    path = authority_dir(grid_home) / CREDS_DIR / f"{name}.creds"
    return path if path.exists() else None


TLS_DIR = "tls"


def local_tls_ca(grid_home: Path) -> Path | None:
    """Grid's private CA under `grid_home` (`gridctl nats init --tls-name`), or None."""
    path = authority_dir(grid_home) / TLS_DIR / "ca.pem"
    return path if path.exists() else None


def _fresh(path: Path, now: float, min_remaining_seconds: float, issuer: str) -> bool:
    """A creds file that exists, was issued by `issuer` (a credential from before its role had an
    account of its own was not) and will not expire within `min_remaining_seconds`."""
    if not path.exists():
        return False
    claims = creds_claims(path)
    exp = claims.get("exp")
    return claims.get("iss") == issuer and (exp is None or float(exp) - now > min_remaining_seconds)


def ensure_local_credentials(grid_home: Path, *, host_ids: Sequence[str], now: float,
                             host_ttl_seconds: float = HOST_CREDENTIAL_TTL_SECONDS) -> LocalCredentials:
    """The authority under `grid_home` (made on first use), the server config snippet, and a
    creds file per local identity: reused while valid, re-issued when a host's is within a
    third of its lifetime of expiring (a restart renews it)."""
    authority = Authority(Path(grid_home) / AUTHORITY_DIR)
    directory = authority.directory / CREDS_DIR
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)

    def creds(principal: Principal, name: str, ttl: float | None) -> Path:
        path = directory / f"{name}.creds"
        if not _fresh(path, now, (ttl or 0.0) / 3, authority.issuer_public(principal)):
            authority.issue_creds(principal, path, now=now, ttl_seconds=ttl)
        return path

    return LocalCredentials(
        controller=creds(Principal(Role.CONTROLLER), "controller", None),
        gateway=creds(Principal(Role.GATEWAY), "gateway", None),
        operator=creds(Principal(Role.OPERATOR), "operator", None),
        hosts={h: creds(authority.host_principal(h), f"host-{escape_token(h)}", host_ttl_seconds) for h in host_ids},
        server_config=authority.write_server_config(now=now),
    )
