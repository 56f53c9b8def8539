"""The controller lease record: what the single-writer lease stores under its KV key.

The record and its signature rule are shared by the controller that writes it
(grid.controller.lease) and the agent that checks who holds it before a fence moves
(grid.agent.credential).
"""

from __future__ import annotations

import msgspec

from grid.events.authorship import SIG_HEADER, SIGNER_HEADER, Authorship
from grid.events.subjects import LEASE_BUCKET

_encoder = msgspec.json.Encoder()

LEASE_KEY = "controller"


class LeaseRecord(msgspec.Struct, frozen=True, kw_only=True):
    controller_id: str
    term: int
    ttl_seconds: float
    # Informational wall-clock times of the holder; expiry is never judged from them.
    renewed_at: float = 0.0
    expires_at: float = 0.0
    released: bool = False
    # The holder's proof of authorship (grid.identity.signing): its user JWT and its signature
    # over this record with both fields empty, for the lease key's subject. Anyone can make the
    # server store bytes under the lease key (a reply subject is never checked), so an agent
    # trusts only a record its grid's controller signed; commands must then be signed by that key.
    signer: str = ""
    signature: str = ""


def lease_subject(key: str = LEASE_KEY) -> str:
    return f"$KV.{LEASE_BUCKET}.{key}"


def unsigned_bytes(record: LeaseRecord) -> bytes:
    """What the holder's signature covers: the record with its proof left out."""
    return _encoder.encode(msgspec.structs.replace(record, signer="", signature=""))


def encode_record(record: LeaseRecord, authorship: Authorship | None, key: str = LEASE_KEY) -> bytes:
    """The KV value of a lease record, signed by `authorship` when the log has identities."""
    if authorship is not None:
        proof = authorship.sign(lease_subject(key), unsigned_bytes(record))
        record = msgspec.structs.replace(record, signer=proof[SIGNER_HEADER], signature=proof[SIG_HEADER])
    return _encoder.encode(record)


lease_decoder = msgspec.json.Decoder(LeaseRecord)
