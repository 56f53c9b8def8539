"""Event base class: immutable msgspec Structs tagged "<domain>.<kind>.v<N>".

`at` is the sender's clock: every consumer uses the log's receipt time (the JetStream message
timestamp) for freshness, ordering and age calculations. The one use of `at` is as a heartbeat's
signed time (the signature covers it), which must be newer than the host's last folded heartbeat
and near its receipt time, so a heartbeat stored again is rejected
(grid.events.authorship.heartbeat_replay).
"""

from __future__ import annotations

import uuid

import msgspec


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    event_id: str
    at: float


class Record(msgspec.Struct, frozen=True, kw_only=True):
    """Base for nested value objects carried inside events."""


def new_event_id() -> str:
    return uuid.uuid4().hex
