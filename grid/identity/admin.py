"""The operator's identity actions on the controller's machine: invite a host, revoke one.

Both act on the authority under the grid home (owner-only files: whoever reads them already
holds the grid). A revocation is pushed to the servers as a new account JWT over the system
account, which makes the full resolver close the host's connections at once.
"""

from __future__ import annotations

import time
from pathlib import Path

import nats

from grid.identity.authority import Authority, push_account_jwt
from grid.identity.creds import connect_options
from grid.identity.enrolment import EnrolmentService
from grid.identity.invitations import INVITATION_TTL_SECONDS, Invitation
from grid.identity.local import authority_dir
from grid.identity.service import invitation_store


class IdentityAdminError(RuntimeError):
    pass


def _authority(grid_home: Path) -> Authority:
    directory = authority_dir(grid_home)
    if not directory.exists():
        raise IdentityAdminError(f"no grid authority under {grid_home}: start the grid with `gridctl up` "
                                 "(or `gridctl nats init` for an existing server) first")
    return Authority(directory)


def invite(grid_home: Path, servers: tuple[str, ...], *, host_id: str, now: float,
           ttl_seconds: float = INVITATION_TTL_SECONDS, failure_domain: str | None = None,
           tags: tuple[str, ...] = (), dedicated: bool = False,
           tls_fingerprint: str | None = None) -> tuple[Invitation, str]:
    """A single-use invitation for `host_id` and the join token that redeems it."""
    authority = _authority(grid_home)
    service = EnrolmentService(authority, invitation_store(authority), clock=lambda: now)
    invitation, token = service.invite(host_id, servers=servers, tls_fingerprint=tls_fingerprint,
                                       ttl_seconds=ttl_seconds, failure_domain=failure_domain, tags=tags,
                                       dedicated=dedicated)
    return invitation, token.encode()


async def revoke(grid_home: Path, url: str, host_id: str, *, now: float | None = None,
                 tls_ca: Path | None = None, timeout: float = 10.0) -> None:
    """Revoke every credential of `host_id` (renewal refused from now on) and push the account
    JWT carrying the revocation to the servers, which disconnect the host."""
    authority = _authority(grid_home)
    if host_id not in authority.registry.hosts:
        raise IdentityAdminError(f"no host {host_id!r} was ever admitted to this grid")
    at = time.time() if now is None else now
    account_jwt = authority.revoke_host(host_id, now=at)
    system = authority.system_creds(now=at)
    nc = await nats.connect(url, name="grid-revoke", allow_reconnect=False, max_reconnect_attempts=0,
                            connect_timeout=timeout, **connect_options(system, tls_ca))
    try:
        await push_account_jwt(nc, authority.account_public, account_jwt, timeout=timeout)
    finally:
        await nc.close()
