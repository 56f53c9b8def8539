"""NATS JWT v2 claims (operator, account, user) encoded and signed with nkeys.

The token format is the one `nsc` and nats-server use: base64url(header) "." base64url(claims)
"." base64url(ed25519 signature of the first two parts), the header naming `ed25519-nkey`, the
claims carrying `jti` = base32(sha512/256(claims without jti)). Keys come from nkeys (through
nats-jwt's key helpers); the claims are plain dicts rather than nats-jwt 0.2.2's classes, because
those serialise an account's `revocations` (and `signing_keys`) as an empty object, silently
dropping the very field that revokes a host. The server is the reference for the format: every
token written here is loaded by a real nats-server in tests/security.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import msgspec
import nkeys
from nats_jwt.nkeys_ext import keypair_from_pubkey

HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
NO_LIMIT = -1

_encoder = msgspec.json.Encoder(order="deterministic")
_decoder = msgspec.json.Decoder(dict[str, Any])


class JWTError(ValueError):
    pass


def b64url(data: bytes) -> str:
    """Unpadded base64url, as JWTs and Grid's signature headers write bytes."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _jti(claims: dict[str, Any]) -> str:
    digest = hashlib.new("sha512_256", _encoder.encode(claims)).digest()
    return base64.b32encode(digest).rstrip(b"=").decode()


def encode(claims: dict[str, Any], signer: nkeys.KeyPair, *, issued_at: int) -> str:
    """Sign `claims` (sub, name, nats, optional exp) as `signer`, issued at `issued_at`."""
    body = dict(claims)
    body["iss"] = signer.public_key.decode()
    body["iat"] = int(issued_at)
    body.pop("jti", None)
    body["jti"] = _jti(body)
    head = b64url(_encoder.encode(HEADER)) + "." + b64url(_encoder.encode(body))
    return head + "." + b64url(signer.sign(head.encode()))


def decode(token: str) -> dict[str, Any]:
    """The claims of a token, unverified (use `verify` before trusting them)."""
    parts = token.split(".")
    if len(parts) != 3:
        raise JWTError("a NATS JWT has three dot-separated parts")
    try:
        return _decoder.decode(unb64url(parts[1]))
    except (ValueError, msgspec.DecodeError) as exc:
        raise JWTError(f"undecodable JWT claims: {exc}") from exc


def verify(token: str, issuer_public_key: str) -> dict[str, Any]:
    """The claims, after checking the signature is `issuer_public_key`'s and `iss` names it."""
    claims = decode(token)
    if claims.get("iss") != issuer_public_key:
        raise JWTError("token was not issued by the expected key")
    head, _, sig = token.rpartition(".")
    try:
        keypair_from_pubkey(issuer_public_key.encode()).verify(head.encode(), unb64url(sig))
    except (nkeys.NkeysError, ValueError) as exc:
        raise JWTError("bad token signature") from exc
    return claims


def operator_claims(operator_public: str, name: str, *, system_account: str) -> dict[str, Any]:
    return {
        "sub": operator_public,
        "name": name,
        "nats": {"type": "operator", "version": 2, "system_account": system_account},
    }


def account_claims(
    account_public: str, name: str, *, jetstream: bool, revocations: dict[str, int] | None = None,
    exports: list[dict[str, Any]] | None = None, imports: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    limits: dict[str, Any] = {
        "subs": NO_LIMIT, "data": NO_LIMIT, "payload": NO_LIMIT,
        "imports": NO_LIMIT, "exports": NO_LIMIT, "wildcards": True, "conn": NO_LIMIT, "leaf": NO_LIMIT,
    }
    if jetstream:
        limits.update(mem_storage=NO_LIMIT, disk_storage=NO_LIMIT, streams=NO_LIMIT, consumer=NO_LIMIT)
    nats: dict[str, Any] = {"type": "account", "version": 2, "limits": limits}
    if revocations:
        # user public key -> unix seconds: every user JWT of that key issued at or before it is
        # refused at connect, and live connections holding one are closed when this lands.
        nats["revocations"] = dict(sorted(revocations.items()))
    # What other accounts of the operator may reach here, and what this account reaches in
    # them (grid.identity.accounts builds both).
    if exports:
        nats["exports"] = exports
    if imports:
        nats["imports"] = imports
    return {"sub": account_public, "name": name, "nats": nats}


def user_claims(
    user_public: str,
    name: str,
    *,
    pub_allow: list[str],
    pub_deny: list[str],
    sub_allow: list[str],
    sub_deny: list[str],
    allow_responses: bool,
    expires_at: int | None,
    tags: list[str] | None = None,
    max_responses: int = 1,
    response_ttl_seconds: float = 60.0,
    max_payload: int = NO_LIMIT,
) -> dict[str, Any]:
    nats: dict[str, Any] = {
        "type": "user",
        "version": 2,
        "subs": NO_LIMIT,
        "data": NO_LIMIT,
        # The largest message the server accepts from this user (-1: the server's max_payload).
        "payload": int(max_payload),
        "pub": {"allow": pub_allow, **({"deny": pub_deny} if pub_deny else {})},
        "sub": {"allow": sub_allow, **({"deny": sub_deny} if sub_deny else {})},
    }
    if allow_responses:
        # By default one reply per request received, within a minute: what a request/reply
        # service needs (and what JetStream flow-control requests on an ordered consumer need).
        # A streamed answer (grid.infer) needs many (`max_responses` -1: no count limit; the server
        # reads 0 as one). Either
        # way a user may only answer a reply subject of a request the server delivered to it.
        nats["resp"] = {"max": int(max_responses), "ttl": int(response_ttl_seconds * 1_000_000_000)}
    if tags:
        nats["tags"] = tags
    claims: dict[str, Any] = {"sub": user_public, "name": name, "nats": nats}
    if expires_at is not None:
        claims["exp"] = int(expires_at)
    return claims
