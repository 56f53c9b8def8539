"""Input digest: sha256 hex of the deterministic encoding of a PlannerInput."""

from __future__ import annotations

import hashlib

from grid.events.codec import encode_value
from grid.fleet.planning import PlannerInput


def input_bytes(inp: PlannerInput) -> bytes:
    return encode_value(inp)


def inputs_digest(inp: PlannerInput) -> str:
    return hashlib.sha256(encode_value(inp)).hexdigest()
