"""One encoder and one decoder for the whole event union, built once.

Decoding goes through an upcast chain: an old tag with a registered upcaster is converted one
version at a time to the current class (pyeventsourcing's ``upcast_v1_v2`` habit). An unknown
tag or malformed payload raises ``EventDecodeError``; live consumers count and skip it, strict
replay stops with the sequence number.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Union

import msgspec

from grid.events.acks import ActionAck
from grid.events.base import Event
from grid.events.commands import CommandIssued, CommandWithdrawn
from grid.events.control import (
    CredentialRevoked,
    ForecastWindowSet,
    HostOverride,
    ModeSet,
    ProfileRemoved,
    ProfileSet,
    RouteAdmitted,
    RouteWithdrawn,
    TickRequested,
)
from grid.events.evaluations import EvaluationRecorded
from grid.events.host import HostHeartbeat, HostRegistered, ProtectionTransition, QualificationRecorded
from grid.events.plan import PlanCreated
from grid.events.requests import RequestBatch, RequestCompleted, RequestFailed

EVENT_TYPES: tuple[type[Event], ...] = (
    HostRegistered,
    HostHeartbeat,
    ProtectionTransition,
    QualificationRecorded,
    ActionAck,
    RequestCompleted,
    RequestFailed,
    RequestBatch,
    ProfileSet,
    ProfileRemoved,
    ModeSet,
    HostOverride,
    TickRequested,
    ForecastWindowSet,
    CredentialRevoked,
    RouteAdmitted,
    RouteWithdrawn,
    EvaluationRecorded,
    PlanCreated,
    CommandIssued,
    CommandWithdrawn,
)
AnyEvent = Union[EVENT_TYPES]  # type: ignore[valid-type]

TAGS: dict[str, type[Event]] = {t.__struct_config__.tag: t for t in EVENT_TYPES}  # type: ignore[misc]

# old tag -> (pure function old dict -> next version dict). Empty while everything is v1.
UPCASTERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}


def builtin_value(value: Any) -> Any:
    """What msgspec cannot encode by itself, as a value it can (its `enc_hook`): a read-only
    Mapping that is not a dict (a projection's SharedMap) is encoded as the dict it reads as."""
    if isinstance(value, Mapping):
        return dict(value.items())
    # The error msgspec raises itself for a type it cannot encode.
    raise TypeError(f"Encoding objects of type {type(value).__name__} is unsupported")


_encoder = msgspec.json.Encoder(order="deterministic", enc_hook=builtin_value)
_decoder = msgspec.json.Decoder(AnyEvent)


class _TagPeek(msgspec.Struct):
    type: str | None = None


_peek_decoder = msgspec.json.Decoder(_TagPeek)


class EventDecodeError(ValueError):
    def __init__(self, reason: str, tag: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.tag = tag


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


def encode_value(value: Any) -> bytes:
    """Deterministic JSON for any msgspec-encodable value (digests, plans, snapshots)."""
    return _encoder.encode(value)


def peek_tag(data: bytes) -> str | None:
    try:
        return _peek_decoder.decode(data).type
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def decode(data: bytes) -> Event:
    try:
        return _decoder.decode(data)
    except msgspec.ValidationError as exc:
        tag = peek_tag(data)
        if tag in UPCASTERS:
            return _upcast(data, tag)
        if tag is not None and tag not in TAGS:
            raise EventDecodeError(f"unknown event tag {tag!r}", tag) from exc
        raise EventDecodeError(f"invalid event payload: {exc}", tag) from exc
    except msgspec.DecodeError as exc:
        raise EventDecodeError(f"malformed event bytes: {exc}") from exc


def _upcast(data: bytes, tag: str) -> Event:
    payload: dict[str, Any] = msgspec.json.decode(data)
    seen: set[str] = set()
    while tag in UPCASTERS:
        if tag in seen:
            raise EventDecodeError(f"upcaster cycle at {tag!r}", tag)
        seen.add(tag)
        payload = UPCASTERS[tag](payload)
        tag = payload.get("type", "")
    try:
        return msgspec.convert(payload, AnyEvent)
    except msgspec.ValidationError as exc:
        raise EventDecodeError(f"upcast of {tag!r} failed: {exc}", tag) from exc
