"""The operator's identity actions: invite a host (on the controller's machine), revoke one.

Both act on the authority under the grid home (owner-only files: whoever reads them already
holds the grid). A revocation is pushed to the servers as a new account JWT over the system
account, which makes the full resolver close the host's connections at once; and it is appended
to the log as a `CredentialRevoked` naming the keys, signed by this grid home's operator
identity, so every fold (and every replay) refuses what those keys sign from that position of the
log on, whatever reaches the streams later (a stored message copied back, a key that leaked).
An operator machine (a grid home holding the operator credential, not the authority) asks for the
revocation on the log instead, and the controller, which holds the authority, applies it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import msgspec

from grid.events import codec
from grid.events.base import new_event_id
from grid.events.control import CredentialRevoked
from grid.events.subjects import revocation_subject
from grid.identity.authority import Authority, push_account_jwts, sync_account_jwts
from grid.identity.connect import connect_log
from grid.identity.creds import connect_options
from grid.identity.enrolment import EnrolmentService
from grid.identity.invitations import INVITATION_TTL_SECONDS, Invitation, split_servers
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


class RevocationNotApplied(IdentityAdminError):
    """From an operator machine: the request is on the log, but no controller applied it to the
    servers in time (is one running?). It applies it when it next runs; running again is harmless."""


class Revocation(msgspec.Struct, frozen=True):
    host_id: str
    keys: tuple[str, ...]
    # Where the CredentialRevoked naming the keys landed on the log (its stream and sequence).
    stream: str
    seq: int
    # Where an operator machine's request landed (None: revoked where the authority lives).
    requested_seq: int | None = None


# How long `gridctl node revoke` on an operator machine waits for a controller to apply it.
REVOCATION_APPLY_TIMEOUT_SECONDS = 30.0


def holds_authority(grid_home: Path) -> bool:
    """Whether `grid_home` holds the grid's authority (the account key that signs the servers'
    revocation list): the controller's machine. An operator machine holds only the operator
    credential."""
    return (authority_dir(grid_home) / "account.nk").exists()


async def sync_accounts(authority: Authority, url: str, *, tls_ca: Path | None = None,
                        timeout: float = 10.0) -> list[str]:
    """Hand the servers at `url` every account of the grid they hold otherwise (as the system
    account; one server of a cluster is enough). What a process holding the authority does
    before its own hosts connect to a server whose config predates them (`gridctl up --nats`).
    Returns the accounts pushed."""
    system = authority.system_creds(now=time.time())
    nc = await connect_client(servers=list(split_servers(url)), name="grid-accounts", allow_reconnect=False,
                              max_reconnect_attempts=0, connect_timeout=timeout, **connect_options(system, tls_ca))
    try:
        return await sync_account_jwts(nc, authority.all_account_jwts(time.time()), timeout=timeout)
    finally:
        await nc.close()


async def revoke(grid_home: Path, url: str, host_id: str, *, now: float | None = None,
                 tls_ca: Path | None = None, timeout: float = 10.0, reason: str = "",
                 apply_timeout: float = REVOCATION_APPLY_TIMEOUT_SECONDS) -> Revocation:
    """Revoke every credential of `host_id`. `url` may list several servers, comma-separated.

    Where the authority lives (the controller's machine): renewal refused from now on, the
    account JWT carrying the revocation pushed to the servers, which disconnect the host, and a
    `CredentialRevoked` with the keys appended, signed as this grid home's operator.
    From an operator machine (a grid home with the operator credential only, `revoke_remotely`):
    the revocation is asked for on the log, and a controller applies it as above.
    Running it again (after a failure) repeats each step harmlessly."""
    if not holds_authority(grid_home):
        if local_credential(grid_home, "operator") is not None:
            return await revoke_remotely(grid_home, url, host_id, tls_ca=tls_ca, timeout=timeout, reason=reason,
                                         apply_timeout=apply_timeout)
        raise IdentityAdminError(f"no grid authority and no operator credential under {grid_home}: revoke on the "
                                 "controller's machine, or on a machine whose grid home holds the operator credential")
    authority = _authority(grid_home)
    if host_id not in authority.registry.hosts:
        raise IdentityAdminError(f"no host {host_id!r} was ever admitted to this grid")
    operator = local_credential(grid_home, "operator")
    if operator is None:
        raise IdentityAdminError(f"no operator credential under {grid_home}: the revocation is signed by the "
                                 "operator identity `gridctl up` (or `gridctl nats init`) makes there")
    tls_ca = tls_ca if tls_ca is not None else local_tls_ca(grid_home)
    at = time.time() if now is None else now
    updates = authority.revoke_host(host_id, now=at)
    keys = tuple(authority.registry.hosts[host_id].revoked_keys)
    system = authority.system_creds(now=at)
    # One server of a cluster is enough (the system account carries the update to the others);
    # nats-py takes a list, never a comma-separated string.
    nc = await connect_client(servers=list(split_servers(url)), name="grid-revoke", allow_reconnect=False,
                              max_reconnect_attempts=0, connect_timeout=timeout, **connect_options(system, tls_ca))
    try:
        await push_account_jwts(nc, updates, timeout=timeout)
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


async def revoke_remotely(grid_home: Path, url: str, host_id: str, *, tls_ca: Path | None = None,
                          timeout: float = 10.0, reason: str = "",
                          apply_timeout: float = REVOCATION_APPLY_TIMEOUT_SECONDS) -> Revocation:
    """Ask, on the log, for `host_id`'s revocation (a `CredentialRevoked` naming no keys, signed as
    this home's operator identity), then wait for a controller to apply it: it revokes the host
    where the authority lives, pushes the servers' revocation list, and appends the revocation
    naming the keys (`apply_requested_revocations`). Status marks the host revoked from the
    request on."""
    operator = local_credential(grid_home, "operator")
    if operator is None:
        raise IdentityAdminError(f"no operator credential under {grid_home}")
    tls_ca = tls_ca if tls_ca is not None else local_tls_ca(grid_home)
    event_log = await connect_log(url, credentials=operator, tls_ca=tls_ca, name="grid-revoke",
                                  ensure_streams=False, timeout=timeout)
    try:
        request = await event_log.append(CredentialRevoked(event_id=new_event_id(), at=time.time(), host_id=host_id,
                                                           keys=(), reason=reason))
        # The host's revocations after the request (the operator reads streams through ordered
        # consumers, never message gets): the controller's names the keys.
        sub = await event_log.subscribe(request.stream, start_seq=request.seq + 1,
                                        subject_filter=revocation_subject(host_id))
        try:
            deadline = time.monotonic() + apply_timeout
            while (remaining := deadline - time.monotonic()) > 0:
                msg = await sub.next(timeout=min(remaining, 1.0))
                if msg is None:
                    continue
                applied = codec.decode(msg.data)
                if isinstance(applied, CredentialRevoked) and applied.keys:
                    return Revocation(host_id=host_id, keys=applied.keys, stream=msg.stream, seq=msg.seq,
                                      requested_seq=request.seq)
        finally:
            await sub.close()
        raise RevocationNotApplied(
            f"the revocation of host {host_id} is on the log ({request.stream} sequence {request.seq}), but no "
            f"controller applied it to the servers within {apply_timeout:g}s: is a controller running? It "
            "applies it when it next runs; running this again is harmless")
    finally:
        await event_log.close()


async def apply_requested_revocations(grid_home: Path, url: str, requested: Mapping[str, tuple[float, str]], *,
                                      timeout: float = 10.0) -> list[Revocation]:
    """What a controller does with revocations asked for on the log (`revoke_remotely`):
    `requested` maps each host the fleet marks revoked to (receipt time of its latest revocation,
    reason). Each host this authority admitted, has not revoked, and has not invited again since
    that time, is revoked here (`revoke`: servers and log). Returns what was applied."""
    if not holds_authority(grid_home):
        return []
    authority = _authority(grid_home)
    applied = []
    for host_id, (requested_at, reason) in sorted(requested.items()):
        record = authority.registry.hosts.get(host_id)
        if record is None or record.revoked_at is not None:
            continue  # never admitted here, or revoked already (this is the confirmation)
        if record.readmitted_at is not None and requested_at <= record.readmitted_at:
            continue  # invited again after that revocation
        applied.append(await revoke(grid_home, url, host_id, timeout=timeout, reason=reason))
    return applied
