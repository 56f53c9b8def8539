"""The operator's identity actions on the controller's machine: invite a host, revoke one.

Both act on the authority under the grid home (owner-only files: whoever reads them already
holds the grid). A revocation is pushed to the servers as a new account JWT over the system
account, which makes the full resolver close the host's connections at once; and it is appended
to the log as a `CredentialRevoked` naming the keys, signed by this grid home's operator
identity, so every fold (and every replay) refuses what those keys sign from that position of the
log on, whatever reaches the streams later (a stored message copied back, a key that leaked).
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec

from grid.events.base import new_event_id
from grid.events.control import CredentialRevoked
from grid.identity.authority import Authority, push_account_jwt
from grid.identity.connect import connect_log
from grid.identity.creds import connect_options
from grid.identity.enrolment import EnrolmentService
from grid.identity.invitations import INVITATION_TTL_SECONDS, Invitation
from grid.identity.local import authority_dir, local_credential, local_tls_ca
from grid.identity.service import invitation_store
from grid.transport.nats_failover import connect_client


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


class RevocationNotLogged(IdentityAdminError):
    """The servers refuse the host, but the log does not say so yet (the folds still accept
    what its keys sign): running the revocation again appends it."""


class Revocation(msgspec.Struct, frozen=True):
    host_id: str
    keys: tuple[str, ...]
    # Where the CredentialRevoked landed on the log (its stream and sequence).
    stream: str
    seq: int


async def revoke(grid_home: Path, url: str, host_id: str, *, now: float | None = None,
                 tls_ca: Path | None = None, timeout: float = 10.0, reason: str = "") -> Revocation:
    """Revoke every credential of `host_id` (renewal refused from now on), push the account JWT
    carrying the revocation to the servers, which disconnect the host, and append a
    `CredentialRevoked` with the keys, signed as this grid home's operator. Running it again
    (after a failure) repeats each step harmlessly."""
    authority = _authority(grid_home)
    if host_id not in authority.registry.hosts:
        raise IdentityAdminError(f"no host {host_id!r} was ever admitted to this grid")
    operator = local_credential(grid_home, "operator")
    if operator is None:
        raise IdentityAdminError(f"no operator credential under {grid_home}: the revocation is signed by the "
                                 "operator identity `gridctl up` (or `gridctl nats init`) makes there")
    tls_ca = tls_ca if tls_ca is not None else local_tls_ca(grid_home)
    at = time.time() if now is None else now
    account_jwt = authority.revoke_host(host_id, now=at)
    keys = tuple(authority.registry.hosts[host_id].revoked_keys)
    system = authority.system_creds(now=at)
    nc = await connect_client(servers=url, name="grid-revoke", allow_reconnect=False, max_reconnect_attempts=0,
                              connect_timeout=timeout, **connect_options(system, tls_ca))
    try:
        await push_account_jwt(nc, authority.account_public, account_jwt, timeout=timeout)
    finally:
        await nc.close()
    try:
        event_log = await connect_log(url, credentials=operator, tls_ca=tls_ca, name="grid-revoke",
                                      ensure_streams=False, timeout=timeout)
        try:
            appended = await event_log.append(CredentialRevoked(event_id=new_event_id(), at=at, host_id=host_id,
                                                                keys=keys, reason=reason))
        finally:
            await event_log.close()
    except Exception as exc:
        raise RevocationNotLogged(f"host {host_id} is revoked on the servers, but the revocation could not be "
                                  f"appended to the log ({type(exc).__name__}: {exc}); run the command again") from exc
    return Revocation(host_id=host_id, keys=keys, stream=appended.stream, seq=appended.seq)
