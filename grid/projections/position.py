"""Where in the log an event was read: stream, sequence and receipt time (server clock)."""

from __future__ import annotations

import msgspec


class Position(msgspec.Struct, frozen=True):
    stream: str
    seq: int
    time: float
