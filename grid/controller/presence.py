"""Controllers announce themselves, so status can say which one is active and which stand by.

Each controller writes one record under `presence.<id>` in the lease bucket every lease step
(a few seconds apart) and a `stopped` record when it stops cleanly. The records are beside the
lease, never in an event stream: they are operational state, not history, and reading them
costs the streams nothing. Which controller is active is decided by the lease alone; a record
only says what its writer believed when it wrote it, and `presence_view` joins the two.

A record is judged stale on the reader's clock against the server's timestamp of the entry, so
a controller that was SIGKILLed shows as `unresponsive` once it missed three announcements.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import msgspec

from grid.events.subjects import LEASE_BUCKET

PRESENCE_PREFIX = "presence."
# What a controller says of itself.
ANNOUNCE_ACTIVE = "active"
ANNOUNCE_STANDBY = "standby"
ANNOUNCE_STOPPED = "stopped"
# What status shows (the lease decides "active").
ACTIVE = "active"
STANDBY = "standby"
STOPPED = "stopped"
UNRESPONSIVE = "unresponsive"
# A record older than this many announcement intervals is unresponsive.
STALE_INTERVALS = 3.0

_KEY_SAFE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class PresenceRecord(msgspec.Struct, frozen=True, kw_only=True):
    controller_id: str
    state: str
    term: int
    interval_seconds: float
    admin_url: str | None = None
    started_at: float | None = None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(PresenceRecord)


def presence_key(controller_id: str) -> str:
    """The KV key of a controller's record (ids that are not key-safe are hashed)."""
    token = controller_id if _KEY_SAFE.match(controller_id) else hashlib.sha256(controller_id.encode()).hexdigest()[:32]
    return PRESENCE_PREFIX + token


async def announce(log_: Any, record: PresenceRecord) -> None:
    await log_.kv_put(LEASE_BUCKET, presence_key(record.controller_id), _encoder.encode(record))


async def read_presence(log_: Any) -> list[tuple[PresenceRecord, float | None]]:
    """Every controller's last record with the server's time of it (None where the log has no
    listing, e.g. the in-memory log of unit tests: then only this controller is known)."""
    entries = getattr(log_, "kv_entries", None)
    if entries is None:
        return []
    out = []
    for entry, at in await entries(LEASE_BUCKET, PRESENCE_PREFIX + ">"):
        try:
            out.append((_decoder.decode(entry.value), at))
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue  # a damaged record says nothing; the lease is the truth anyway
    return out


def presence_view(records: list[tuple[PresenceRecord, float | None]], *, now: float, holder_id: str | None,
                  holder_term: int) -> list[dict[str, Any]]:
    """Status rows, active first: the lease holder is active; the others stand by, stopped, or
    went silent. Pure: `now` is the reader's clock, each record's time the server's."""
    rows = []
    for rec, at in records:
        age = None if at is None else max(0.0, now - at)
        if rec.state == ANNOUNCE_STOPPED:
            state = STOPPED
        elif age is not None and age > STALE_INTERVALS * rec.interval_seconds:
            state = UNRESPONSIVE
        elif rec.controller_id == holder_id:
            state = ACTIVE
        else:
            state = STANDBY
        rows.append({"controller_id": rec.controller_id, "state": state,
                     "term": holder_term if state == ACTIVE else rec.term,
                     "admin_url": rec.admin_url, "started_at": rec.started_at,
                     "announced_age_seconds": None if age is None else round(age, 3)})
    order = {ACTIVE: 0, STANDBY: 1, UNRESPONSIVE: 2, STOPPED: 3}
    rows.sort(key=lambda r: (order[r["state"]], r["controller_id"]))
    return rows
