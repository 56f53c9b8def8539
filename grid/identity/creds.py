"""User credentials files (`.creds`: a user JWT plus its nkey seed) and how a client uses one.

The file layout is the one nats-server's tools write and every NATS client reads. The seed in it
is the identity's private key: the file is created owner-only and never leaves the machine whose
process generated the key.
"""

from __future__ import annotations

import base64
import re
import ssl
from pathlib import Path
from typing import Any

import nkeys

from grid.identity import jwt
from grid.identity.accounts import INFER_JWT_CLAIM
from grid.identity.permissions import Principal, inbox_prefix, principal_from_tags
from grid.secrets import SecretFileError, write_owner_only

_BLOCK = re.compile(r"-{3,}BEGIN ([A-Z ]+)-{3,}\s*\n(.+?)\n\s*-{3,}END \1-{3,}", re.S)


class CredentialsError(ValueError):
    pass


def format_creds(user_jwt: str, seed: bytes | str) -> bytes:
    seed_text = seed.decode() if isinstance(seed, bytes) else seed
    return (
        "-----BEGIN NATS USER JWT-----\n"
        f"{user_jwt}\n"
        "------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{seed_text}\n"
        "------END USER NKEY SEED------\n\n"
        "*************************************************************\n"
    ).encode()


def write_creds(path: Path, user_jwt: str, seed: bytes | str) -> Path:
    write_owner_only(path, format_creds(user_jwt, seed))
    return path


def parse_creds(text: str) -> tuple[str, str]:
    """(user JWT, seed) from the text of a creds file."""
    blocks = {name.strip(): body.strip() for name, body in _BLOCK.findall(text)}
    try:
        return blocks["NATS USER JWT"], blocks["USER NKEY SEED"]
    except KeyError:
        raise CredentialsError("not a NATS credentials file (needs a user JWT and a seed)") from None


def read_creds(path: Path) -> tuple[str, str]:
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise SecretFileError(f"{path} is readable by others (mode {mode:o}); chmod 600 it")
    return parse_creds(path.read_text())


def creds_claims(path: Path) -> dict[str, Any]:
    return jwt.decode(read_creds(path)[0])


def credential_principal(path: Path) -> Principal | None:
    """Who a creds file speaks for (a host's agent learns its command consumer's name here)."""
    return principal_from_tags(list(creds_claims(path).get("nats", {}).get("tags") or []))


def client_tls_context(ca_path: Path) -> ssl.SSLContext:
    """Verify the server against Grid's private CA (or a pinned server certificate)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca_path))
    # A pinned leaf certificate (before enrolment has delivered the CA) is a trust anchor too.
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


def connect_options(credentials: Path | None, tls_ca: Path | None) -> dict[str, Any]:
    """The nats-py `connect` keyword arguments for a credentials file and a CA file.

    The inbox prefix is the one the credential's JWT allows subscribing to (derived from its
    user key), so request/reply and JetStream deliveries work under per-identity inboxes.
    """
    options: dict[str, Any] = {}
    if credentials is not None:
        path = Path(credentials)
        claims = creds_claims(path)
        options["user_credentials"] = str(path)
        options["inbox_prefix"] = inbox_prefix(str(claims["sub"]))
    if tls_ca is not None:
        options["tls"] = client_tls_context(Path(tls_ca))
    return options


def infer_connect_options(credentials: Path, tls_ca: Path | None) -> dict[str, Any] | None:
    """The nats-py `connect` options for a gateway credential's second identity, the same key in
    the INFER account (grid.identity.accounts), or None when the credential carries none."""
    user_jwt, seed = read_creds(Path(credentials))
    claims = jwt.decode(user_jwt)
    infer_jwt = claims.get(INFER_JWT_CLAIM)
    if not infer_jwt:
        return None
    pair = nkeys.from_seed(seed.encode())
    options: dict[str, Any] = {
        "user_jwt_cb": lambda: str(infer_jwt).encode(),
        "signature_cb": lambda nonce: base64.b64encode(pair.sign(nonce.encode())),
        "inbox_prefix": inbox_prefix(str(claims["sub"])),
    }
    if tls_ca is not None:
        options["tls"] = client_tls_context(Path(tls_ca))
    return options
