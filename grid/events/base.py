"""Event base class: immutable msgspec Structs tagged "<domain>.<kind>.v<N>".

`at` is the sender's clock and only informational: every consumer uses the log's receipt
time (the JetStream message timestamp) for freshness, ordering and age calculations.
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
