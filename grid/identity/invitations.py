"""Invitations to join the grid as a host: single-use, expiring, stored only as hashes.

`gridctl invite` creates one and prints its join token; the token alone lets one machine join
once, as the host id the invitation names. The store keeps sha256(secret), never the secret, so
a copy of the store lets nobody join. Redeeming is a compare-and-set under a file lock, so two
joins racing on one token (or on two controller processes) admit at most one machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import secrets
from collections.abc import Iterator
from pathlib import Path

import msgspec

from grid.identity.jwt import b64url, unb64url
from grid.secrets import write_owner_only

INVITATION_TTL_SECONDS = 15 * 60.0
TOKEN_PREFIX = "gridjoin1."

# Reasons a join is refused (the reply carries one; nothing else about the store leaks).
REFUSED_UNKNOWN_INVITATION = "unknown_invitation"
REFUSED_INVITATION_USED = "invitation_used"
REFUSED_INVITATION_EXPIRED = "invitation_expired"


class InvitationError(ValueError):
    pass


class Invitation(msgspec.Struct, frozen=True):
    invitation_id: str
    secret_sha256: str
    host_id: str
    created_at: float
    expires_at: float
    failure_domain: str | None = None
    tags: tuple[str, ...] = ()
    dedicated: bool = False
    used_at: float | None = None


def split_servers(servers: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """One server URL per entry: a cluster's comma-separated list (`nats://a:4222,tls://b:4222`,
    as --nats / GRID_NATS_URL / nats.url give it) becomes its separate servers."""
    items = (servers,) if isinstance(servers, str) else tuple(servers)
    return tuple(part.strip() for item in items for part in item.split(",") if part.strip())


class JoinToken(msgspec.Struct, frozen=True):
    """Everything a new machine needs: where to connect, the one-time secret, the server's TLS
    fingerprint (None on a plain loopback listener), and the invitee credential (a user JWT
    that may only ask to join, and its seed), which expires with the invitation."""

    servers: tuple[str, ...]
    secret: str
    tls_fingerprint: str | None
    invitee_jwt: str
    invitee_seed: str

    def __post_init__(self) -> None:
        # A comma-separated list never reaches a token as one server (nats-py would read
        # `4222,tls:` as a port); a token made before this rule is read the same way.
        split = split_servers(self.servers)
        if split != self.servers:
            msgspec.structs.force_setattr(self, "servers", split)

    def encode(self) -> str:
        return TOKEN_PREFIX + b64url(msgspec.json.encode(self))

    @classmethod
    def decode(cls, text: str) -> "JoinToken":
        text = text.strip()
        if not text.startswith(TOKEN_PREFIX):
            raise InvitationError("not a Grid join token")
        body = text[len(TOKEN_PREFIX):]
        try:
            return msgspec.json.decode(unb64url(body), type=cls)
        except (ValueError, msgspec.DecodeError) as exc:
            raise InvitationError(f"malformed join token: {exc}") from exc


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class InvitationStore:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock_path = self.path.with_name(self.path.name + ".lock")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[list[Invitation]]:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self._lock_path, "a+b") as lock:
            self._lock_path.chmod(0o600)
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                invitations = (
                    list(msgspec.json.decode(self.path.read_bytes(), type=list[Invitation]))
                    if self.path.exists()
                    else []
                )
                before = list(invitations)
                yield invitations
                if invitations != before:
                    write_owner_only(self.path, msgspec.json.encode(invitations))
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def create(self, host_id: str, *, now: float, ttl_seconds: float = INVITATION_TTL_SECONDS,
               failure_domain: str | None = None, tags: tuple[str, ...] = (),
               dedicated: bool = False) -> tuple[Invitation, str]:
        """A new invitation and its secret (the secret is returned once and never stored)."""
        if ttl_seconds <= 0:
            raise InvitationError("an invitation needs a positive lifetime")
        secret = secrets.token_urlsafe(32)
        invitation = Invitation(
            invitation_id=secrets.token_hex(8), secret_sha256=secret_hash(secret), host_id=host_id,
            created_at=now, expires_at=now + ttl_seconds, failure_domain=failure_domain,
            tags=tuple(tags), dedicated=dedicated,
        )
        with self._locked() as invitations:
            # Expired and used invitations are kept a day for the audit trail, then dropped.
            invitations[:] = [i for i in invitations if max(i.expires_at, i.used_at or 0) > now - 86_400]
            invitations.append(invitation)
        return invitation, secret

    def redeem(self, secret: str, *, now: float) -> Invitation | str:
        """Mark the invitation of `secret` used and return it, or return a REFUSED_* reason."""
        wanted = secret_hash(secret)
        with self._locked() as invitations:
            for index, invitation in enumerate(invitations):
                if not hmac.compare_digest(invitation.secret_sha256, wanted):
                    continue
                if invitation.used_at is not None:
                    return REFUSED_INVITATION_USED
                if now >= invitation.expires_at:
                    return REFUSED_INVITATION_EXPIRED
                used = msgspec.structs.replace(invitation, used_at=now)
                invitations[index] = used
                return used
        return REFUSED_UNKNOWN_INVITATION

    @contextlib.contextmanager
    def editing(self) -> Iterator[list[Invitation]]:
        """The invitations, under the store's lock, written back if changed: where the
        controllers' shared records are merged in (grid.identity.shared_registry)."""
        with self._locked() as invitations:
            yield invitations

    def entries(self) -> list[Invitation]:
        with self._locked() as invitations:
            return list(invitations)
