"""Authorship as a property of each message: ed25519 signatures over subject + payload.

Subject permissions keep honest clients in their lane, but they do not prove who wrote a stored
event: the server itself publishes on request (JetStream API and direct-get replies, any
service's reply) to a subject the requester chooses, and a stream stores whatever lands on its
subjects. So every control-path message carries two headers:

- `Grid-Signer`: the producer's user JWT, signed by the grid's account key. It names the
  producer's public nkey and, in its tags, the principal (role, host id) the credential speaks for.
- `Grid-Sig`: base64url ed25519 signature, by that nkey, over `subject + "\\n" + payload`.

A verifier pins the account key (every credential's JWT names its issuer, so a process learns it
from its own credential) and accepts a message only when the JWT is the account's, the
signature holds over the subject the message was *stored under*, the signer's key was not
revoked before this point of the log, and the permission table (grid.identity.permissions, the
one source of truth the server also enforces) lets that principal publish on that subject. A
reflected message keeps the reflector's bytes but lands on another subject, so its signature
fails; a message the reflector signed itself names a principal that may not write there.

Each check has a reason constant; folds count skips by reason and never stop on one.
"""

from __future__ import annotations

import base64
import os
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

import msgspec
import nkeys
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from grid.events.authorship import SIG_HEADER, SIGNER_HEADER, Signed
from grid.events.log import subject_matches
from grid.identity import jwt
from grid.identity.creds import read_creds
from grid.identity.permissions import Principal, Role, grant_for, principal_from_tags

# Why a message was not accepted as its signer's.
UNSIGNED = "unsigned"
BAD_SIGNATURE = "bad_signature"
UNKNOWN_SIGNER = "unknown_signer"
EXPIRED_SIGNER = "expired_signer"
REVOKED_SIGNER = "revoked_signer"
NOT_PERMITTED = "not_permitted"
REJECTION_REASONS: tuple[str, ...] = (UNSIGNED, BAD_SIGNATURE, UNKNOWN_SIGNER, EXPIRED_SIGNER, REVOKED_SIGNER,
                                      NOT_PERMITTED)

# How often a signer looks at its creds file again (an agent's credential is renewed in place).
CREDS_RECHECK_SECONDS = 30.0
# Signers remembered by a verifier (one entry per credential seen; a fleet has one per process).
SIGNER_CACHE_SIZE = 65_536


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def signed_bytes(subject: str, data: bytes) -> bytes:
    """What a signature covers: the subject the message is meant for, then its payload."""
    return subject.encode("utf-8") + b"\n" + data


def _public_key(user_public: str) -> Ed25519PublicKey:
    """The raw ed25519 key inside an nkey public key (base32: prefix byte, 32 key bytes, crc16)."""
    raw = base64.b32decode(user_public + "=" * (-len(user_public) % 8))
    if len(raw) != 35:
        raise ValueError("not an nkey public key")
    return Ed25519PublicKey.from_public_bytes(raw[1:33])


class Signer:
    """Signs as one identity: its user JWT and nkey seed, from a creds file or given directly."""

    def __init__(self, user_jwt: str, seed: str | bytes, *, path: Path | None = None) -> None:
        self._path = path
        self._checked = time.monotonic()
        self._stamp = self._file_stamp()
        self._load(user_jwt, seed)

    @classmethod
    def from_creds(cls, path: Path) -> "Signer":
        user_jwt, seed = read_creds(Path(path))
        return cls(user_jwt, seed, path=Path(path))

    def _load(self, user_jwt: str, seed: str | bytes) -> None:
        pair = nkeys.from_seed(seed.encode() if isinstance(seed, str) else seed)
        claims = jwt.decode(user_jwt)
        public = pair.public_key.decode()
        if claims.get("sub") != public:
            raise ValueError("the credential's JWT and its seed name different keys")
        self.user_jwt = user_jwt
        self.public_key = public
        self.account = str(claims.get("iss", ""))
        self.principal = principal_from_tags(list(claims.get("nats", {}).get("tags") or []))
        self._key = Ed25519PrivateKey.from_private_bytes(_raw_seed(seed))

    def _file_stamp(self) -> tuple[int, int] | None:
        if self._path is None:
            return None
        try:
            st = os.stat(self._path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def _refresh(self) -> None:
        now = time.monotonic()
        if self._path is None or now - self._checked < CREDS_RECHECK_SECONDS:
            return
        self._checked = now
        stamp = self._file_stamp()
        if stamp is not None and stamp != self._stamp:
            self._stamp = stamp
            user_jwt, seed = read_creds(self._path)
            self._load(user_jwt, seed)

    def sign(self, subject: str, data: bytes) -> dict[str, str]:
        """The headers that prove this identity wrote `data` for `subject`."""
        self._refresh()
        return {SIGNER_HEADER: self.user_jwt, SIG_HEADER: _b64(self._key.sign(signed_bytes(subject, data)))}


def _raw_seed(seed: str | bytes) -> bytes:
    """The 32-byte ed25519 seed inside an nkey seed (base32: two prefix bytes, seed, crc16)."""
    text = seed.decode() if isinstance(seed, bytes) else seed
    raw = base64.b32decode(text + "=" * (-len(text) % 8))
    if len(raw) != 36:
        raise ValueError("not an nkey seed")
    return raw[2:34]


class _Known(msgspec.Struct, frozen=True):
    """A signer JWT the verifier checked once: its key, principal and lifetime (or why not)."""

    public: str = ""
    principal: Principal | None = None
    expires_at: int | None = None
    key: object = None
    problem: str = ""


class Verifier:
    """Checks signed messages against one grid's account key and the permission table."""

    def __init__(self, account_public: str) -> None:
        self.account = account_public
        self._known: OrderedDict[str, _Known] = OrderedDict()
        self._permitted: dict[tuple[str, str], bool] = {}

    def _signer(self, user_jwt: str) -> _Known:
        known = self._known.get(user_jwt)
        if known is not None:
            return known
        try:
            claims = jwt.verify(user_jwt, self.account)
            public = str(claims["sub"])
            principal = principal_from_tags(list(claims.get("nats", {}).get("tags") or []))
            if principal is None or not public.startswith("U"):
                known = _Known(problem=UNKNOWN_SIGNER)
            else:
                exp = claims.get("exp")
                known = _Known(public=public, principal=principal, key=_public_key(public),
                               expires_at=int(exp) if exp is not None else None)
        except (jwt.JWTError, KeyError, ValueError, TypeError):
            known = _Known(problem=UNKNOWN_SIGNER)
        self._known[user_jwt] = known
        if len(self._known) > SIGNER_CACHE_SIZE:
            self._known.popitem(last=False)
        return known

    def may_write(self, principal: Principal, public: str, subject: str) -> bool:
        """The permission table's answer: may `principal` publish on `subject`?"""
        cache_key = (public, subject)
        hit = self._permitted.get(cache_key)
        if hit is None:
            grant = grant_for(principal, public)
            hit = (any(subject_matches(p, subject) for p in grant.pub_allow)
                   and not any(subject_matches(p, subject) for p in grant.pub_deny))
            if len(self._permitted) > SIGNER_CACHE_SIZE:
                self._permitted.clear()
            self._permitted[cache_key] = hit
        return hit

    def verify(self, subject: str, data: bytes, headers: Mapping[str, str] | None, *, at: float,
               revoked: Mapping[str, object] | None = None, check_permission: bool = True) -> Signed:
        """Who wrote `data` stored under `subject` at log time `at`, or why nobody provably did."""
        if not headers or SIG_HEADER not in headers or SIGNER_HEADER not in headers:
            return Signed(reason=UNSIGNED)
        known = self._signer(headers[SIGNER_HEADER])
        if known.problem or known.principal is None:
            return Signed(reason=known.problem or UNKNOWN_SIGNER)
        try:
            known.key.verify(_unb64(headers[SIG_HEADER]), signed_bytes(subject, data))  # type: ignore[attr-defined]
        except (InvalidSignature, ValueError, TypeError):
            return Signed(reason=BAD_SIGNATURE)
        principal = known.principal
        # A host credential outlives its expiry only in the log: judged by receipt time.
        if known.expires_at is not None and at > known.expires_at:
            return Signed(reason=EXPIRED_SIGNER, signer=known.public, role=principal.role.value)
        if revoked is not None and known.public in revoked:
            return Signed(reason=REVOKED_SIGNER, signer=known.public, role=principal.role.value)
        if check_permission and not self.may_write(principal, known.public, subject):
            return Signed(reason=NOT_PERMITTED, signer=known.public, role=principal.role.value)
        return Signed(signer=known.public, role=principal.role.value, host_id=principal.host_id)


class Identity:
    """One process's authorship (grid.events.authorship.Authorship): it signs as its credential
    and verifies against the grid that issued it."""

    def __init__(self, signer: Signer, verifier: Verifier | None = None) -> None:
        self.signer = signer
        self.verifier = verifier or Verifier(signer.account)

    @classmethod
    def from_creds(cls, path: Path) -> "Identity":
        return cls(Signer.from_creds(Path(path)))

    @property
    def public_key(self) -> str:
        return self.signer.public_key

    @property
    def role(self) -> Role | None:
        return self.signer.principal.role if self.signer.principal is not None else None

    def sign(self, subject: str, data: bytes) -> dict[str, str]:
        return self.signer.sign(subject, data)

    def verify(self, subject: str, data: bytes, headers: Mapping[str, str] | None, *, at: float,
               revoked: Mapping[str, object] | None = None) -> Signed:
        return self.verifier.verify(subject, data, headers, at=at, revoked=revoked)
