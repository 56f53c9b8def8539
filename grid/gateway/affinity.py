"""X-Grid-Affinity-Key: hashed at once, rendezvous-hashed among near-equivalent routes.

The raw key lives only inside `parse_affinity_key`; everything after that sees its sha256
digest. Telemetry carries a second hash (sha256 of the digest, hex) so workload-sequence
learning can group a session without being able to recover or even re-derive the routing hash.
The raw key is never forwarded upstream, logged, or stored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TypeVar

import msgspec

HEADER = "x-grid-affinity-key"
MAX_KEY_BYTES = 256

REASON_EMPTY = "empty"
REASON_TOO_LONG = "too_long"
REASON_NOT_UTF8 = "not_utf8"
REASON_NOT_PRINTABLE = "not_printable"


class AffinityError(msgspec.Struct, frozen=True):
    reason: str
    message: str


def parse_affinity_key(raw: bytes | None) -> bytes | AffinityError | None:
    """The sha256 digest of a valid key, None when absent, or an AffinityError (-> 400)."""
    if raw is None:
        return None
    if not raw:
        return AffinityError(REASON_EMPTY, "X-Grid-Affinity-Key must not be empty")
    if len(raw) > MAX_KEY_BYTES:
        return AffinityError(REASON_TOO_LONG, f"X-Grid-Affinity-Key must be at most {MAX_KEY_BYTES} UTF-8 bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return AffinityError(REASON_NOT_UTF8, "X-Grid-Affinity-Key must be UTF-8")
    if not text.isprintable():
        return AffinityError(REASON_NOT_PRINTABLE, "X-Grid-Affinity-Key must be printable")
    return hashlib.sha256(raw).digest()


def telemetry_hash(digest: bytes) -> str:
    """The double hash carried in request features (never the routing digest itself)."""
    return hashlib.sha256(digest).hexdigest()


def rendezvous_score(digest: bytes, member: str) -> int:
    return int.from_bytes(hashlib.blake2b(digest + member.encode(), digest_size=8).digest(), "big")


T = TypeVar("T")


def rendezvous_pick(digest: bytes, members: Sequence[T], name_of: callable[[T], str]) -> T:  # type: ignore[valid-type]
    """Highest random weight: adding a member moves only the keys that member now wins."""
    best: T | None = None
    best_score = -1
    best_name = ""
    for m in members:
        name = name_of(m)
        score = rendezvous_score(digest, name)
        if score > best_score or (score == best_score and name < best_name):
            best, best_score, best_name = m, score, name
    if best is None:
        raise ValueError("rendezvous_pick needs at least one member")
    return best
