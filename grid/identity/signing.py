"""Authorship as a property of each message: ed25519 signatures over subject + payload.

Subject permissions keep honest clients in their lane, but they do not prove who wrote a stored
event: the server itself publishes on request (JetStream API and direct-get replies, any
service's reply) to a subject the requester chooses, and a stream stores whatever lands on its
subjects. So every control-path message carries two headers:

- `Grid-Signer`: the producer's signer certificate, a compact statement signed by the grid's
  account key: "public nkey K speaks for role R (host H) until E". The authority puts it in every
  user JWT it issues (claim `grid_cert`), so it travels wherever credentials do, and a message
  carries ~250 bytes of proof instead of the kilobytes of the JWT's permission lists. A
  credential issued before certificates existed signs with its whole JWT instead; both verify.
- `Grid-Sig`: base64url ed25519 signature, by that nkey, over `subject + "\\n" + payload`.

A verifier pins the account key (every credential's JWT names the grid's account, so a process
learns it from its own credential) and accepts a message only when the certificate is the account's, the
signature holds over the subject the message was *stored under*, the signer's credential had not
expired at the message's receipt time, its key was not revoked before this point of the log, and
the permission table (grid.identity.permissions, the one source of truth the server also
enforces) lets that principal publish on that subject. A reflected message keeps the reflector's
bytes but lands on another subject, so its signature fails; a message the reflector signed itself
names a principal that may not write there.

Each check has a reason constant; folds count skips by reason and never stop on one.
"""

from __future__ import annotations

import base64
import os
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import msgspec
import nacl.exceptions
import nacl.signing
import nkeys

from grid.events.authorship import SIG_HEADER, SIGNER_HEADER, Signed
from grid.events.log import subject_matches
from grid.identity import jwt
from grid.identity.creds import read_creds
from grid.identity.jwt import b64url, unb64url
from grid.identity.permissions import Principal, Role, grant_for, host_consumer_prefix, principal_from_tags

# Why a message was not accepted as its signer's.
UNSIGNED = "unsigned"
BAD_SIGNATURE = "bad_signature"
UNKNOWN_SIGNER = "unknown_signer"
EXPIRED_SIGNER = "expired_signer"
REVOKED_SIGNER = "revoked_signer"
NOT_PERMITTED = "not_permitted"
REJECTION_REASONS: tuple[str, ...] = (UNSIGNED, BAD_SIGNATURE, UNKNOWN_SIGNER, EXPIRED_SIGNER, REVOKED_SIGNER,
                                      NOT_PERMITTED)

# The user JWT claim that carries the signer certificate.
CERT_CLAIM = "grid_cert"
# The user JWT claim naming the grid's account, whose key signs every certificate: hosts and
# invitees live in accounts of their own (grid.identity.accounts), so their JWT's issuer is not it.
GRID_ACCOUNT_CLAIM = "grid_account"


def grid_account(claims: Mapping[str, object]) -> str:
    """The grid account a user JWT's claims vouch for (a credential issued before hosts had
    accounts of their own names it as its issuer)."""
    return str(claims.get(GRID_ACCOUNT_CLAIM) or claims.get("iss", ""))

# How often a signer looks at its creds file again (an agent's credential is renewed in place).
CREDS_RECHECK_SECONDS = 30.0
# Signers remembered by a verifier (one entry per credential seen; a fleet has one per process).
SIGNER_CACHE_SIZE = 65_536


def signed_bytes(subject: str, data: bytes) -> bytes:
    """What a signature covers: the subject the message is meant for, then its payload."""
    return subject.encode("utf-8") + b"\n" + data


def _public_key(nkey_public: str) -> nacl.signing.VerifyKey:
    """The raw ed25519 key inside an nkey public key (base32: prefix byte, 32 key bytes, crc16).

    libsodium (PyNaCl, which nkeys already needs) verifies in about two thirds of OpenSSL's time."""
    raw = base64.b32decode(nkey_public + "=" * (-len(nkey_public) % 8))
    if len(raw) != 35:
        raise ValueError("not an nkey public key")
    return nacl.signing.VerifyKey(raw[1:33])


def _holds(key: object, subject: str, data: bytes, signature: str) -> bool:
    try:
        key.verify(signed_bytes(subject, data), unb64url(signature))  # type: ignore[attr-defined]
    except (nacl.exceptions.CryptoError, ValueError, TypeError):
        return False
    return True


class Certificate(msgspec.Struct, frozen=True, omit_defaults=True):
    """What the account vouches for: key `k` speaks for role `r` (host `h`) from `i` until `e`."""

    k: str
    r: str
    h: str | None = None
    i: int = 0
    e: int | None = None


_cert_encoder = msgspec.json.Encoder(order="deterministic")
_cert_decoder = msgspec.json.Decoder(Certificate)


def certify(account: nkeys.KeyPair, user_public: str, principal: Principal, *, issued_at: int,
            expires_at: int | None) -> str:
    """A signer certificate: base64url(certificate JSON) "." base64url(account signature)."""
    body = b64url(_cert_encoder.encode(Certificate(k=user_public, r=principal.role.value, h=principal.host_id,
                                                  i=issued_at, e=expires_at)))
    return body + "." + b64url(account.sign(body.encode("ascii")))


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
        # What goes in the Grid-Signer header: the certificate when the JWT carries one.
        self.proof = str(claims.get(CERT_CLAIM) or user_jwt)
        self.public_key = public
        self.account = grid_account(claims)
        self.principal = principal_from_tags(list(claims.get("nats", {}).get("tags") or []))
        self._key = nacl.signing.SigningKey(_raw_seed(seed))

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
        return {SIGNER_HEADER: self.proof, SIG_HEADER: b64url(self._key.sign(signed_bytes(subject, data)).signature)}


def _raw_seed(seed: str | bytes) -> bytes:
    """The 32-byte ed25519 seed inside an nkey seed (base32: two prefix bytes, seed, crc16)."""
    text = seed.decode() if isinstance(seed, bytes) else seed
    raw = base64.b32decode(text + "=" * (-len(text) % 8))
    if len(raw) != 36:
        raise ValueError("not an nkey seed")
    return raw[2:34]


def _principal(role: Role, host_id: str | None) -> Principal:
    """The principal a certificate names. A host's command consumer is not in it: writing needs
    none, and the permission table only asks that one be named."""
    if role is Role.HOST and host_id is not None:
        return Principal(role, host_id=host_id, command_consumer=host_consumer_prefix(host_id) + "certified")
    return Principal(role, host_id=host_id)


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
        self._account_key = _public_key(account_public)
        self._known: OrderedDict[str, _Known] = OrderedDict()
        self._permitted: dict[tuple[str, str], bool] = {}

    def _signer(self, proof: str) -> _Known:
        known = self._known.get(proof)
        if known is not None:
            return known
        try:
            known = self._certificate(proof) if proof.count(".") == 1 else self._jwt(proof)
        except (jwt.JWTError, KeyError, ValueError, TypeError, msgspec.DecodeError, msgspec.ValidationError,
                nacl.exceptions.CryptoError):
            known = _Known(problem=UNKNOWN_SIGNER)
        self._known[proof] = known
        if len(self._known) > SIGNER_CACHE_SIZE:
            self._known.popitem(last=False)
        return known

    def _certificate(self, proof: str) -> _Known:
        body, sig = proof.split(".")
        self._account_key.verify(body.encode("ascii"), unb64url(sig))
        cert = _cert_decoder.decode(unb64url(body))
        principal = _principal(Role(cert.r), cert.h)
        return _Known(public=cert.k, principal=principal, key=_public_key(cert.k), expires_at=cert.e)

    def _jwt(self, user_jwt: str) -> _Known:
        claims = jwt.verify(user_jwt, self.account)
        public = str(claims["sub"])
        principal = principal_from_tags(list(claims.get("nats", {}).get("tags") or []))
        if principal is None or not public.startswith("U"):
            return _Known(problem=UNKNOWN_SIGNER)
        exp = claims.get("exp")
        return _Known(public=public, principal=principal, key=_public_key(public),
                      expires_at=int(exp) if exp is not None else None)

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

    def prime(self, headers: Iterable[Mapping[str, str] | None]) -> None:
        """Learn every signer of a batch (on the thread that folds) before `signatures` runs."""
        for h in headers:
            if h and SIGNER_HEADER in h:
                self._signer(h[SIGNER_HEADER])

    def signatures(self, messages: Sequence[tuple[str, bytes, Mapping[str, str] | None]]) -> list[bool | None]:
        """Whether each (subject, data, headers) signature holds for its known signer; None when
        the signer is not known yet or there is no signature (`verify` then decides).

        Only reads what `prime` learnt and runs libsodium, which releases the GIL: a fold can
        check a batch on a worker thread while it folds the batch before it."""
        out: list[bool | None] = []
        for subject, data, headers in messages:
            known = self._known.get(headers.get(SIGNER_HEADER, "")) if headers else None
            if known is None or known.key is None or SIG_HEADER not in headers:  # type: ignore[operator]
                out.append(None)
                continue
            out.append(_holds(known.key, subject, data, headers[SIG_HEADER]))  # type: ignore[index]
        return out

    def verify(self, subject: str, data: bytes, headers: Mapping[str, str] | None, *, at: float,
               revoked: Mapping[str, object] | None = None, check_permission: bool = True,
               signature_ok: bool | None = None) -> Signed:
        """Who wrote `data` stored under `subject` at log time `at`, or why nobody provably did.

        `signature_ok`: what `signatures` found for this message (None: check it here)."""
        if not headers or SIG_HEADER not in headers or SIGNER_HEADER not in headers:
            return Signed(reason=UNSIGNED)
        known = self._signer(headers[SIGNER_HEADER])
        if known.problem or known.principal is None:
            return Signed(reason=known.problem or UNKNOWN_SIGNER)
        if signature_ok is None:
            signature_ok = _holds(known.key, subject, data, headers[SIG_HEADER])
        if not signature_ok:
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
               revoked: Mapping[str, object] | None = None, signature_ok: bool | None = None) -> Signed:
        return self.verifier.verify(subject, data, headers, at=at, revoked=revoked, signature_ok=signature_ok)

    def prime(self, headers: Iterable[Mapping[str, str] | None]) -> None:
        self.verifier.prime(headers)

    def signatures(self, messages: Sequence[tuple[str, bytes, Mapping[str, str] | None]]) -> list[bool | None]:
        return self.verifier.signatures(messages)
