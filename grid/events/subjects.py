"""The ONLY place that builds and parses NATS subjects.

Model and host ids may contain dots (``SmolLM2-135M-Instruct.Q4_1.gguf``), which NATS treats as
token separators, so every id is escaped into a token of ``[A-Za-z0-9-]`` plus ``_XX`` hex escapes
(``_`` itself is escaped, keeping the mapping reversible).
"""

from __future__ import annotations

import base64
import re
import string

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

PREFIX = "grid"

HOSTS_STREAM = "GRID_HOSTS"
REQUESTS_STREAM = "GRID_REQS"
CONTROL_STREAM = "GRID_CTL"
PLANS_STREAM = "GRID_PLANS"
COMMANDS_STREAM = "GRID_CMDS"

STREAM_SUBJECTS: dict[str, tuple[str, ...]] = {
    HOSTS_STREAM: ("grid.host.>",),
    REQUESTS_STREAM: ("grid.req.>",),
    CONTROL_STREAM: ("grid.ctl.>",),
    PLANS_STREAM: ("grid.plan",),
    COMMANDS_STREAM: ("grid.cmd.>",),
}
ALL_STREAMS: tuple[str, ...] = tuple(STREAM_SUBJECTS)
# A mirror of GRID_CMDS (same sequences, no subjects of its own) that every reader but the
# controller replays and tails commands through: consumers on GRID_CMDS itself are the
# controller's alone, since creating one by name re-points a host's command consumer
# (grid.identity.permissions). Not an event stream of its own: never in ALL_STREAMS.
COMMANDS_VIEW_STREAM = "GRID_CMDS_VIEW"

LEASE_BUCKET = "grid_lease"
# The controllers' shared authority records (grid.identity.shared_registry): one subject per
# admitted host, open invitation and revoked non-host key, each a sealed record only the holders
# of the grid's authority can read or write. Not an event stream: never in ALL_STREAMS, and no
# role but the controller reaches it (grid.identity.permissions).
AUTHORITY_STREAM = "GRID_AUTHORITY"
AUTHORITY_SUBJECTS = "grid.authority.>"
AUTHORITY_RECORD_KINDS = ("host", "invitation", "revoked")
PLAN_SUBJECT = "grid.plan"
MODE_SUBJECT = "grid.ctl.mode"
TICK_SUBJECT = "grid.ctl.tick"
FORECAST_WINDOW_SUBJECT = "grid.ctl.forecast-window"

# An object store chunk subject token (a NATS nuid), as read from an object's metadata.
_NUID = re.compile(r"^[A-Za-z0-9]{1,64}$")
_SAFE = frozenset(string.ascii_letters + string.digits + "-")


class SubjectError(ValueError):
    pass


def escape_token(value: str) -> str:
    if not value:
        raise SubjectError("an id used in a subject must not be empty")
    out: list[str] = []
    for ch in value:
        if ch in _SAFE:
            out.append(ch)
        else:
            out.extend(f"_{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out)


def unescape_token(token: str) -> str:
    raw = bytearray()
    i = 0
    while i < len(token):
        ch = token[i]
        if ch == "_":
            try:
                raw.append(int(token[i + 1 : i + 3], 16))
            except ValueError as exc:
                raise SubjectError(f"bad escape in subject token {token!r}") from exc
            i += 3
        else:
            raw.extend(ch.encode("ascii"))
            i += 1
    return raw.decode("utf-8")


# Every kind of event a host appends under `grid.host.<id>.<kind>` (`subject_for` below): a host's
# credential may publish exactly these subjects and no other (grid.identity.permissions).
HOST_EVENT_KINDS: tuple[str, ...] = ("registered", "heartbeat", "protection", "qualification", "ack")


def host_subject(host_id: str, kind: str) -> str:
    return f"{PREFIX}.host.{escape_token(host_id)}.{kind}"


def host_subjects(host_id: str) -> tuple[str, ...]:
    """The exact subjects host `host_id` appends on, one per kind of host event."""
    return tuple(host_subject(host_id, kind) for kind in HOST_EVENT_KINDS)


# A host in its own NATS account appends through the grid's ingress (grid.controller.ingress): what
# it publishes as `grid.host.<id>.<kind>` arrives in GRID as `grid.ingress.<id>.<kind>`, which no
# stream captures, and a controller stores what is within the host's budget under the host
# subject. The host never writes into a stream itself.
INGRESS_ROOT = f"{PREFIX}.ingress"


def ingress_subject(host_id: str, kind: str) -> str:
    return f"{INGRESS_ROOT}.{escape_token(host_id)}.{kind}"


def host_wildcard(host_id: str | None = None) -> str:
    return f"{PREFIX}.host.{escape_token(host_id)}.>" if host_id else f"{PREFIX}.host.>"


def request_subject(kind: str) -> str:
    return f"{PREFIX}.req.{kind}"


def profile_subject(model_id: str) -> str:
    return f"{PREFIX}.ctl.profile.{escape_token(model_id)}"


def evaluation_subject(model_id: str) -> str:
    return f"{PREFIX}.ctl.evaluation.{escape_token(model_id)}"


def override_subject(host_id: str) -> str:
    return f"{PREFIX}.ctl.override.{escape_token(host_id)}"


def revocation_subject(host_id: str) -> str:
    return f"{PREFIX}.ctl.revocation.{escape_token(host_id)}"


def route_subject(host_id: str, model_id: str) -> str:
    """Where the operator admits or withdraws host `host_id`'s external route for `model_id`."""
    return f"{PREFIX}.ctl.route.{escape_token(host_id)}.{escape_token(model_id)}"


def command_subject(host_id: str) -> str:
    return f"{PREFIX}.cmd.{escape_token(host_id)}"


# Inference travels on core NATS request/reply, outside every stream: no prompt or response is
# ever persisted. Only the gateway publishes these and only host <id> subscribes to its own.
INFER_FAMILY = "infer"


def infer_request_subject(host_id: str) -> str:
    return f"{PREFIX}.{INFER_FAMILY}.{escape_token(host_id)}.req"


def infer_cancel_subject(host_id: str) -> str:
    return f"{PREFIX}.{INFER_FAMILY}.{escape_token(host_id)}.cancel"


def infer_wildcard(host_id: str | None = None) -> str:
    return f"{PREFIX}.{INFER_FAMILY}.{escape_token(host_id)}.>" if host_id else f"{PREFIX}.{INFER_FAMILY}.>"


# Model artifacts live in a JetStream object store bucket (grid.transport.artifact_store), one
# object per blob, named by its sha256 hex digest. The object store's own subject layout is
# fixed by NATS: `$O.<bucket>.M.<base64url(name)>` holds an object's metadata and
# `$O.<bucket>.C.<nuid>` its chunks, all in the stream `OBJ_<bucket>`.
ARTIFACT_BUCKET = "grid_artifacts"
ARTIFACT_STREAM = f"OBJ_{ARTIFACT_BUCKET}"
ARTIFACT_SUBJECTS = f"$O.{ARTIFACT_BUCKET}.>"
ARTIFACT_META_SUBJECTS = f"$O.{ARTIFACT_BUCKET}.M.>"


def artifact_meta_subject(object_name: str) -> str:
    token = base64.urlsafe_b64encode(object_name.encode("utf-8")).decode()
    return f"$O.{ARTIFACT_BUCKET}.M.{token}"


def artifact_chunk_subject(nuid: str) -> str:
    if not nuid or not _NUID.match(nuid):
        raise SubjectError(f"not an object store nuid: {nuid[:40]!r}")
    return f"$O.{ARTIFACT_BUCKET}.C.{nuid}"


def authority_record_subject(kind: str, name: str) -> str:
    """`grid.authority.<kind>.<name>`: where the shared record of one host (by host id), one
    invitation (by invitation id) or one revoked key lives."""
    if kind not in AUTHORITY_RECORD_KINDS:
        raise SubjectError(f"unknown authority record kind {kind!r}")
    return f"{PREFIX}.authority.{kind}.{escape_token(name)}"


def stream_for_subject(subject: str) -> str:
    parts = subject.split(".")
    if len(parts) < 2 or parts[0] != PREFIX:
        raise SubjectError(f"not a grid subject: {subject!r}")
    family = parts[1]
    try:
        return {
            "host": HOSTS_STREAM,
            "req": REQUESTS_STREAM,
            "ctl": CONTROL_STREAM,
            "plan": PLANS_STREAM,
            "cmd": COMMANDS_STREAM,
        }[family]
    except KeyError:
        raise SubjectError(f"unknown subject family in {subject!r}") from None


class ParsedSubject(msgspec.Struct, frozen=True):
    stream: str
    kind: str
    host_id: str | None = None
    model_id: str | None = None


def parse_subject(subject: str) -> ParsedSubject:
    stream = stream_for_subject(subject)
    parts = subject.split(".")
    if stream == HOSTS_STREAM and len(parts) == 4:
        return ParsedSubject(stream, parts[3], host_id=unescape_token(parts[2]))
    if stream == COMMANDS_STREAM and len(parts) == 3:
        return ParsedSubject(stream, "command", host_id=unescape_token(parts[2]))
    if stream == CONTROL_STREAM and len(parts) == 4 and parts[2] == "profile":
        return ParsedSubject(stream, "profile", model_id=unescape_token(parts[3]))
    if stream == CONTROL_STREAM and len(parts) == 4 and parts[2] == "evaluation":
        return ParsedSubject(stream, "evaluation", model_id=unescape_token(parts[3]))
    if stream == CONTROL_STREAM and len(parts) == 4 and parts[2] in ("override", "revocation"):
        return ParsedSubject(stream, parts[2], host_id=unescape_token(parts[3]))
    if stream == CONTROL_STREAM and len(parts) == 5 and parts[2] == "route":
        return ParsedSubject(stream, "route", host_id=unescape_token(parts[3]), model_id=unescape_token(parts[4]))
    if len(parts) == 3:
        return ParsedSubject(stream, parts[2])
    if stream == PLANS_STREAM and len(parts) == 2:
        return ParsedSubject(stream, "plan")
    raise SubjectError(f"malformed grid subject: {subject!r}")


def subject_for(event: Event) -> str:
    """The one mapping from an event to the subject it is appended on."""
    match event:
        case HostHeartbeat():
            return host_subject(event.host_id, "heartbeat")
        case HostRegistered():
            return host_subject(event.host_id, "registered")
        case ProtectionTransition():
            return host_subject(event.host_id, "protection")
        case QualificationRecorded():
            return host_subject(event.host_id, "qualification")
        case ActionAck():
            return host_subject(event.host_id, "ack")
        case RequestBatch():
            return request_subject("batch")
        case RequestCompleted():
            return request_subject("completed")
        case RequestFailed():
            return request_subject("failed")
        case ProfileSet():
            return profile_subject(event.profile.model_id)
        case ProfileRemoved():
            return profile_subject(event.model_id)
        case ModeSet():
            return MODE_SUBJECT
        case HostOverride():
            return override_subject(event.host_id)
        case TickRequested():
            return TICK_SUBJECT
        case ForecastWindowSet():
            return FORECAST_WINDOW_SUBJECT
        case CredentialRevoked():
            return revocation_subject(event.host_id)
        case RouteAdmitted() | RouteWithdrawn():
            return route_subject(event.host_id, event.model_id)
        case EvaluationRecorded():
            return evaluation_subject(event.model_id)
        case PlanCreated():
            return PLAN_SUBJECT
        case CommandIssued() | CommandWithdrawn():
            return command_subject(event.host_id)
    raise SubjectError(f"no subject for event type {type(event).__name__}")
