"""The one permission table: what each identity may publish and subscribe to, enforced by NATS.

Every user JWT's `pub`/`sub` lists come from `grant_for`, and the README's security table comes
from `render_security_table`, both reading `ROLES`, so the documentation cannot drift from what
the server enforces. Allow lists are exact; deny lists repeat the dangerous families as a second
line (a deny wins over any allow, so a later, broader allow cannot re-open them).

JetStream is itself spoken over subjects, so the table also names the `$JS.API` calls each role
makes through `grid.transport.jetstream.JetStreamLog`:
- appending is a plain publish to the event's subject (the PubAck comes back on the inbox);
- the controller replays and live-tails a stream with ephemeral ordered consumers; every other
  role reads with `$JS.API.STREAM.INFO.<stream>` (positions) and batched direct gets
  (`$JS.API.DIRECT.GET.<stream>`, grid.transport.direct_reads), from an account of its own;
- a host consumes its commands through its own durable pull consumer on GRID_CMDS, which the
  controller creates when it admits the host (`provision_host_consumer`): the host may look it
  up (`CONSUMER.INFO`), fetch (`CONSUMER.MSG.NEXT`) and ack (`$JS.ACK.GRID_CMDS.<consumer>.>`)
  but not create or update it, because a consumer update can re-point delivery at any subject
  (a push `deliver_subject` such as another host's heartbeat) and the server checks no
  permission on that. For the same reason no role but the controller creates a consumer at all;
- every other reader of commands (operator, reader: events tail and export, replay, history,
  the dashboard) reads GRID_CMDS_VIEW, a mirror the controller keeps (same sequences, no host
  consumer on it), and GRID_CMDS's positions with `STREAM.INFO` only. The host consumer's
  unguessable name (`agent-<id>-<random>`) stays a second line;
- a host reads single messages by subject or sequence through `$JS.API.STREAM.MSG.GET.<stream>`.
  That request names its subject in the body, so a host may read any message of GRID_HOSTS
  (another host's last heartbeat, not just its own): heartbeats, registrations and protection
  transitions carry no secret (no prompt, no key; the gateway and operators read the whole
  stream), so that is accepted. The lease bucket holds lease records only, and the artifact
  store holds what every host may load;
- stream, KV and consumer management belong to the controller alone.

Every request the server answers, though, lands its answer on whatever reply subject the
requester names (an API envelope, a PubAck, a status message, a direct get's stored message, or,
for `CONSUMER.MSG.NEXT`, the next command): no permission can stop that, and signatures
(grid.identity.signing) only keep such copies from being folded, not from taking room (aimed at
one GRID_CTL subject often enough, they pushed its real events out of its bounded history). So
every role but the controller lives in a NATS account of its own (grid.identity.accounts): a
reply subject it names is one of its own account, where no stream listens, and the lists here
are the second line behind what its account imports (`host_imports`, `client_imports`). Grid's
own services answer only under the requester's inbox, or on a reply the server made up for a
request from another account (grid.identity.replies).

A host is a tenant, not a peer: it may publish only its exact subjects (`host_subjects`, no
wildcard under its prefix); no message of it is larger than `HOST_MAX_PAYLOAD` (its JWT's
`payload` limit, which the server enforces before anything is stored) and GRID_HOSTS stores no
event larger than `HOST_EVENT_MAX_BYTES` (its max_msg_size); GRID_HOSTS keeps a bounded
history per subject (grid.transport.jetstream), so a host can overwrite only its own history.
What it can still do is publish as fast as its connection allows on those subjects. They do not
reach a stream: its account imports them from GRID's ingress (`grid.ingress.<id>.<kind>`), where
the controllers store what is signed and within its budget for that kind of event and refuse the
rest (grid.controller.ingress); the readers' own budgets (grid.projections.budget) are the second
line, for anything that lands in GRID_HOSTS another way.

Each connection's replies arrive under its own inbox prefix (`inbox_prefix`), and a user may
subscribe only there, so nobody reads another identity's PubAcks or consumer deliveries.
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Callable, Sequence

import msgspec

from grid.events.subjects import (
    ALL_STREAMS,
    ARTIFACT_STREAM,
    ARTIFACT_SUBJECTS,
    AUTHORITY_STREAM,
    AUTHORITY_SUBJECTS,
    COMMANDS_STREAM,
    COMMANDS_VIEW_STREAM,
    CONTROL_STREAM,
    HOST_EVENT_KINDS,
    HOSTS_STREAM,
    INGRESS_ROOT,
    LEASE_BUCKET,
    PLAN_SUBJECT,
    PLANS_STREAM,
    PREFIX,
    escape_token,
    ingress_subject,
)
from grid.transport.jetstream import HOST_EVENT_MAX_BYTES

JS_API = "$JS.API"
INBOX_ROOT = "_INBOX"
# The reply subjects the server makes up for a request crossing an account import.
IMPORT_REPLY_ROOT = "_R_"
# Core NATS request/reply, in no stream: a gateway asks a host to serve an inference request.
INFER_ROOT = f"{PREFIX}.infer"
# Core NATS request/reply served by the controller's enrolment service (grid.identity.enrolment).
ENROL_JOIN_SUBJECT = f"{PREFIX}.enrol.join"
ENROL_RENEW_SUBJECT = f"{PREFIX}.enrol.renew"


class Role(enum.StrEnum):
    CONTROLLER = "controller"
    HOST = "host"
    GATEWAY = "gateway"
    OPERATOR = "operator"
    READER = "reader"
    # Holds nothing but the right to ask to join; lives inside a join token until it expires.
    INVITEE = "invitee"


class Principal(msgspec.Struct, frozen=True):
    """Who a credential speaks for: a role, plus the host id and its command consumer's name
    (hosts) or the streams (readers)."""

    role: Role
    host_id: str | None = None
    streams: tuple[str, ...] = ()
    command_consumer: str | None = None

    def __post_init__(self) -> None:
        if (self.role is Role.HOST) != (self.host_id is not None):
            raise ValueError("a host principal, and only a host principal, names a host id")
        if self.command_consumer is not None and not (
            self.host_id is not None and self.command_consumer.startswith(host_consumer_prefix(self.host_id))
        ):
            raise ValueError("a command consumer belongs to a host and is named after it")
        unknown = sorted(set(self.streams) - set(ALL_STREAMS))
        if unknown:
            raise ValueError(f"unknown streams {unknown}")

    @property
    def label(self) -> str:
        return f"host {self.host_id}" if self.role is Role.HOST else self.role.value


# A credential records the principal it was issued for in its JWT's tags.
ROLE_TAG = "grid-role:"
HOST_TAG = "grid-host:"
CONSUMER_TAG = "grid-consumer:"
STREAM_TAG = "grid-stream:"


def principal_tags(principal: Principal) -> list[str]:
    tags = [ROLE_TAG + principal.role.value]
    if principal.host_id is not None:
        tags.append(HOST_TAG + principal.host_id)
    if principal.command_consumer is not None:
        tags.append(CONSUMER_TAG + principal.command_consumer)
    tags += [STREAM_TAG + s for s in principal.streams]
    return tags


def principal_from_tags(tags: list[str]) -> Principal | None:
    """The principal a credential of ours was issued for, else None."""

    def values(prefix: str) -> list[str]:
        return [t[len(prefix):] for t in tags if t.startswith(prefix)]

    roles, hosts, consumers = values(ROLE_TAG), values(HOST_TAG), values(CONSUMER_TAG)
    try:
        return Principal(Role(roles[0]), host_id=hosts[0] if hosts else None,
                         command_consumer=consumers[0] if consumers else None,
                         streams=tuple(values(STREAM_TAG))) if roles else None
    except ValueError:
        return None


class Grant(msgspec.Struct, frozen=True):
    pub_allow: tuple[str, ...]
    pub_deny: tuple[str, ...]
    sub_allow: tuple[str, ...]
    sub_deny: tuple[str, ...]
    allow_responses: bool
    # Replies per request received (-1: unbounded; the server reads 0 as its default of one) and
    # for how long after the request.
    max_responses: int = 1
    response_ttl_seconds: float = 60.0
    # The largest message (headers and payload) the server accepts from this identity (the user
    # JWT's `payload` limit; -1: the server's own max_payload).
    max_payload: int = -1


# A host streams an inference answer as many messages on the requester's reply inbox, for as
# long as a generation may run (the gateway's own deadline is shorter).
INFER_RESPONSE_TTL_SECONDS = 30 * 60.0


# The largest log event a host may append is GRID_HOSTS's max_msg_size, HOST_EVENT_MAX_BYTES
# (grid.transport.jetstream): the stream refuses anything bigger and stores nothing. An agent's
# largest events are its heartbeats: about 1.6 KiB with one residency, plus a few hundred bytes
# per residency and cached artifact, so 64 KiB leaves room for hundreds of them.
# The largest message a host may publish at all (its JWT's `payload` limit, headers included:
# the server refuses a bigger one from the host outright, closing its connection, before the
# ingress or any stream sees it). Just over a host event's size: a flood of messages the ingress
# would refuse as too large costs the controllers little to read (at 320 KiB, 316 KiB messages
# at a hostile host's best rate left the oldest honest heartbeat 2.15 s old, goal 2 s). Its
# streamed inference answers are cut to fit: chunks of grid.infer.wire.CHUNK_BYTES (56 KiB).
HOST_MAX_PAYLOAD = HOST_EVENT_MAX_BYTES + 8 * 1024


def inbox_prefix(user_public_key: str) -> str:
    """The reply-subject prefix of one credential (its nkey is unique and fixed in its JWT)."""
    return f"{INBOX_ROOT}.{user_public_key}"


def host_consumer_prefix(host_id: str) -> str:
    return f"agent-{escape_token(host_id)}-"


def new_host_consumer(host_id: str) -> str:
    """A fresh, unguessable name for the durable consumer a host reads its commands through."""
    return host_consumer_prefix(host_id) + secrets.token_hex(12)


def infer_subject_root(host_id: str) -> str:
    return f"{INFER_ROOT}.{escape_token(host_id)}"


_STREAM_FAMILIES = (f"{PREFIX}.host.>", f"{PREFIX}.cmd.>", f"{PREFIX}.req.>", f"{PREFIX}.ctl.>", PLAN_SUBJECT)
_LEASE = (f"$KV.{LEASE_BUCKET}.>", f"{JS_API}.*.*.KV_{LEASE_BUCKET}", f"{JS_API}.*.*.KV_{LEASE_BUCKET}.>")
# The lease key as the host reads it (nats-py's key_value(): stream info, then a message get;
# JetStreamLog never reads a bucket with direct gets). The bucket holds lease records only.
_LEASE_READ = (f"{JS_API}.STREAM.INFO.KV_{LEASE_BUCKET}", f"{JS_API}.STREAM.MSG.GET.KV_{LEASE_BUCKET}")
# Everything on the lease but those reads: a put, and any consumer on the bucket's stream.
_LEASE_WRITE = (f"$KV.{LEASE_BUCKET}.>", f"{JS_API}.CONSUMER.*.KV_{LEASE_BUCKET}",
                f"{JS_API}.CONSUMER.*.KV_{LEASE_BUCKET}.>")
# The artifact object store (grid.transport.artifact_store). Reading is stream message gets only:
# the object's metadata by subject, then its chunks by sequence. No consumer: a host may create
# none, since a consumer's deliver subject could be any subject (see the module docstring).
_ARTIFACT_READ = (f"{JS_API}.STREAM.MSG.GET.{ARTIFACT_STREAM}",)
# A put publishes chunks and the metadata on `$O.<bucket>.>` (nats-py's put looks the object
# up with a stream message get first). Deleting is a put of deleted metadata: same subjects.
_ARTIFACT_PUT = (ARTIFACT_SUBJECTS, f"{JS_API}.STREAM.INFO.{ARTIFACT_STREAM}", *_ARTIFACT_READ)
# Denied to every role but the controller, whatever its allow list says: GRID's own direct gets
# (their reply is the stored message itself; other roles ask from their own accounts, under
# IMPORTED_JS_PREFIX, where the answer lands) and consumer create/update on GRID_CMDS.
_CONTROLLER_ONLY = (f"{INGRESS_ROOT}.>", f"{JS_API}.DIRECT.GET.>", f"{JS_API}.CONSUMER.CREATE.{COMMANDS_STREAM}",
                    f"{JS_API}.CONSUMER.CREATE.{COMMANDS_STREAM}.>", f"{JS_API}.CONSUMER.DURABLE.CREATE.{COMMANDS_STREAM}.>")
# The controllers' shared authority records (grid.identity.shared_registry): sealed, so reading
# them teaches nothing, but they are the controller's alone. No other role's allow list reaches
# them; this is the second line, in every other role's deny list.
_AUTHORITY = (AUTHORITY_SUBJECTS, f"{JS_API}.*.*.{AUTHORITY_STREAM}", f"{JS_API}.*.*.{AUTHORITY_STREAM}.>",
              f"{JS_API}.*.*.*.{AUTHORITY_STREAM}", f"{JS_API}.*.*.*.{AUTHORITY_STREAM}.>")
_MANAGEMENT = (f"{JS_API}.STREAM.CREATE.>", f"{JS_API}.STREAM.UPDATE.>", f"{JS_API}.STREAM.DELETE.>",
               f"{JS_API}.STREAM.PURGE.>", f"{JS_API}.STREAM.MSG.DELETE.>", f"{JS_API}.CONSUMER.DELETE.>")


def _controller(p: Principal, inbox: str) -> Grant:
    return Grant(
        # `_R_.>`: the reply subjects the server makes up for requests crossing an import. The
        # ingress stores a host's append with the host's reply, so the stream's PubAck goes back
        # to the host, and the server allows a reply subject only if the publisher may publish it.
        pub_allow=(f"{PREFIX}.>", f"{JS_API}.>", "$JS.ACK.>", "$JS.FC.>", f"$KV.{LEASE_BUCKET}.>", ARTIFACT_SUBJECTS,
                   IMPORT_REPLY_ROOT + ".>"),
        pub_deny=(),
        # The ingress: every host's appends, stored by the controllers (grid.controller.ingress).
        sub_allow=(f"{inbox}.>", ENROL_JOIN_SUBJECT, ENROL_RENEW_SUBJECT, f"{INGRESS_ROOT}.>"),
        sub_deny=(),
        allow_responses=True,
    )


# Hosts, gateways, operators and readers live in NATS accounts without JetStream
# (grid.identity.accounts): they reach the grid's JetStream API through imports, under this
# prefix. The server itself answers `$JS.API.>` in an account without JetStream ("not enabled",
# 503), so an import under the same name would get two answers; their JetStream context uses
# this prefix instead (grid.identity.connect).
IMPORTED_JS_PREFIX = "gridjs.API"


def local_subject(subject: str) -> str:
    """What a subject of the GRID account is called inside the account importing it: the
    JetStream API under IMPORTED_JS_PREFIX, and the ingress under the host subjects the agent
    appends on."""
    if subject.startswith(JS_API + "."):
        return IMPORTED_JS_PREFIX + subject[len(JS_API):]
    if subject.startswith(INGRESS_ROOT + "."):
        return f"{PREFIX}.host." + subject[len(INGRESS_ROOT) + 1:]
    return subject


def host_imports(p: Principal) -> tuple[str, ...]:
    """Every GRID subject host `p` reaches (as a service its account imports), no wildcard but
    its own acks: what a host may do is exactly these, whatever its user permissions say."""
    assert p.host_id is not None
    if p.command_consumer is None:
        raise ValueError("a host credential names its command consumer")
    consumer = p.command_consumer
    return (
        # Exactly the subjects its agent appends on, no wildcard under its prefix: a new kind
        # of host event is a new line in grid.events.subjects.HOST_EVENT_KINDS, and anything
        # else under `grid.host.<id>.` (new subjects the stream would store, each with its own
        # per-subject history) reaches nothing. They arrive at the ingress, which no stream
        # captures: a controller stores what is within the host's budget (grid.controller.ingress).
        *(ingress_subject(p.host_id, kind) for kind in HOST_EVENT_KINDS),
        # Its own last events, by subject (clock sync, fence restore). The subject is in the
        # body, so it could read another host's too: nothing there is secret (see above).
        f"{JS_API}.STREAM.MSG.GET.{HOSTS_STREAM}",
        # Its operator override, the last `grid.ctl.override.<id>` (grid.agent.overrides):
        # a message get that could name any GRID_CTL message, none secret (profiles, mode,
        # overrides, revocations; the gateway reads the whole stream).
        f"{JS_API}.STREAM.MSG.GET.{CONTROL_STREAM}",
        f"{JS_API}.CONSUMER.INFO.{COMMANDS_STREAM}.{consumer}",
        f"{JS_API}.CONSUMER.MSG.NEXT.{COMMANDS_STREAM}.{consumer}",
        f"$JS.ACK.{COMMANDS_STREAM}.{consumer}.>",
        # Read-only look at who holds the lease: a command naming another controller is
        # refused even if a permission mistake let it into the host's queue.
        *_LEASE_READ,
        ENROL_RENEW_SUBJECT,
        # Read-only access to the artifact store (a load fetches what the host lacks).
        *_ARTIFACT_READ,
    )


def _host(p: Principal, inbox: str) -> Grant:
    assert p.host_id is not None
    return Grant(
        # What its account imports, by the names they have there; the account boundary is the
        # first line, these exact lists the second.
        pub_allow=tuple(local_subject(s) for s in host_imports(p)),
        pub_deny=(f"{PREFIX}.cmd.>", f"{PREFIX}.req.>", f"{PREFIX}.ctl.>", PLAN_SUBJECT, *_LEASE_WRITE,
                  *_MANAGEMENT, ARTIFACT_SUBJECTS, *_CONTROLLER_ONLY, *_AUTHORITY),
        sub_allow=(f"{inbox}.>", f"{infer_subject_root(p.host_id)}.>"),
        sub_deny=_STREAM_FAMILIES,
        allow_responses=True,
        max_responses=-1,
        response_ttl_seconds=INFER_RESPONSE_TTL_SECONDS,
        max_payload=HOST_MAX_PAYLOAD,
    )


def _direct_read(stream: str) -> tuple[str, ...]:
    # Positions (STREAM.INFO) and messages (batched direct gets, grid.transport.direct_reads):
    # GRID_CMDS's positions, its mirror's messages (see the module docstring).
    source = COMMANDS_VIEW_STREAM if stream == COMMANDS_STREAM else stream
    return (f"{JS_API}.STREAM.INFO.{stream}", f"{JS_API}.DIRECT.GET.{source}")


def _direct_reads(streams: Sequence[str]) -> tuple[str, ...]:
    return tuple(s for stream in streams for s in _direct_read(stream))


# The roles whose processes the grid's operator runs, each in a NATS account of its own
# (grid.identity.accounts), importing from GRID exactly `client_imports`.
CLIENT_ROLES = (Role.GATEWAY, Role.OPERATOR, Role.READER)


def client_imports(p: Principal) -> tuple[str, ...]:
    """Every GRID subject a gateway, operator or reader reaches (its account imports them as
    services; a reader's account imports every stream's reads, its credential allows its own)."""
    if p.role is Role.GATEWAY:
        # Its request features (appends); what routing folds: hosts, profiles and mode, plans.
        return (f"{PREFIX}.req.>", *_direct_reads((HOSTS_STREAM, CONTROL_STREAM, PLANS_STREAM)))
    if p.role is Role.OPERATOR:
        # Control events (appends), every stream (events tail and export, replay, history), the
        # last message of a subject (`gridctl qualify` reads a profile), artifact puts.
        return (f"{PREFIX}.ctl.>", *_direct_reads(ALL_STREAMS), f"{JS_API}.STREAM.MSG.GET.{CONTROL_STREAM}",
                *_ARTIFACT_PUT)
    if p.role is Role.READER:
        return _direct_reads(p.streams)
    raise ValueError(f"{p.role} is not a client role")


def _client(p: Principal, inbox: str, *, writes: tuple[str, ...], elsewhere: tuple[str, ...] = ()) -> Grant:
    # What its account imports, by the names they have there; the account boundary is the first
    # line, the deny list the second. `writes` are the stream subjects it may publish;
    # `elsewhere` what it signs and sends through another account (its INFER connection).
    return Grant(
        pub_allow=(*(local_subject(s) for s in client_imports(p)), *elsewhere),
        pub_deny=(*(f for f in _STREAM_FAMILIES if f not in writes), *_LEASE, *_MANAGEMENT, *_CONTROLLER_ONLY,
                  *_AUTHORITY),
        sub_allow=(f"{inbox}.>",),
        sub_deny=_STREAM_FAMILIES,
        allow_responses=True,
    )


def _gateway(p: Principal, inbox: str) -> Grant:
    # The catalog projection folds profiles from GRID_CTL, so the gateway reads it (never writes).
    # Inference requests go through its second connection, in INFER (grid.identity.accounts),
    # signed by the same key: the agents' verifiers read that right here (grid.identity.signing).
    return _client(p, inbox, writes=(f"{PREFIX}.req.>",), elsewhere=(f"{INFER_ROOT}.>",))


def _operator(p: Principal, inbox: str) -> Grant:
    return _client(p, inbox, writes=(f"{PREFIX}.ctl.>",))


def _reader(p: Principal, inbox: str) -> Grant:
    return _client(p, inbox, writes=())


def _invitee(p: Principal, inbox: str) -> Grant:
    return Grant(
        pub_allow=(ENROL_JOIN_SUBJECT,),
        pub_deny=_CONTROLLER_ONLY,
        sub_allow=(f"{inbox}.>",),
        sub_deny=(),
        allow_responses=False,
    )


class RoleSpec(msgspec.Struct, frozen=True):
    role: Role
    who: str
    may: str
    may_not: str
    grant: Callable[[Principal, str], Grant]


ROLES: tuple[RoleSpec, ...] = (
    RoleSpec(Role.CONTROLLER, "controller",
             "everything on the grid streams, the lease KV, the plan and command subjects; "
             "creates the artifact store and may put into it; answers enrolment requests; stores hosts' appends "
             "from the ingress (`grid.ingress.>`) and passes the stream's answer back", "-", _controller),
    RoleSpec(Role.HOST, "host `<id>`",
             "publish exactly `grid.host.<id>.{registered,heartbeat,protection,qualification,ack}` (events of "
             f"at most {HOST_EVENT_MAX_BYTES // 1024} KiB; no message over {HOST_MAX_PAYLOAD // 1024} KiB at all), "
             "and read back its own last events (a stream message get, which "
             "could name any GRID_HOSTS message: none is secret); read its operator override (a stream "
             "message get on GRID_CTL, none of whose messages is secret either); fetch and ack only its own "
             "durable consumer of `grid.cmd.<id>` (the controller creates it; its unguessable name is in "
             "the credential); read who holds the lease; serve `grid.infer.<id>.>` (streamed replies); "
             "read the artifact store (stream message gets only); renew its credential. Lives in a NATS account "
             "of its own, which imports exactly these from GRID (the JetStream API under `gridjs.API`, its appends "
             "from the ingress `grid.ingress.<id>.<kind>`, where a controller stores what is signed and within "
             "its budget for that kind): any answer it aims at another subject lands in its own account, where "
             "no stream listens, and it never writes into a stream itself",
             "publish any other subject under `grid.host.<id>.` or a larger message; publish or subscribe to "
             "any other host's subjects, publish `grid.cmd.*`, `grid.req.>`, "
             "`grid.ctl.>`, `grid.plan`; write the lease KV; put or delete an artifact; any stream or consumer "
             "management; a direct get or a consumer", _host),
    RoleSpec(Role.GATEWAY, "gateway",
             "publish `grid.req.>`; read GRID_HOSTS, GRID_CTL, GRID_PLANS (stream infos and batched direct gets); "
             "send `grid.infer.>` requests as the same key in the INFER account (a second JWT inside its "
             "credential), which imports each host's service. Lives in the GATEWAYS account, which imports "
             "exactly these from GRID: an answer it aims anywhere lands there",
             "control, commands, host subjects, plans (publish), the lease; a consumer", _gateway),
    RoleSpec(Role.OPERATOR, "operator",
             "read every stream (events tail/export, replay, history: stream infos and batched direct gets, "
             "commands from the controller's mirror GRID_CMDS_VIEW); read the last message of a GRID_CTL subject; "
             "publish `grid.ctl.>`; put artifacts (`gridctl model push`). Lives in the OPERATORS account, "
             "which imports exactly these from GRID",
             "commands, the lease, host subjects, requests, plans (publish); a consumer", _operator),
    RoleSpec(Role.READER, "reader",
             "read the streams named in its credential (stream infos and batched direct gets; GRID_CMDS through "
             "its mirror GRID_CMDS_VIEW). Lives in the READERS account, which imports every stream's reads "
             "and nothing else",
             "any publish; the lease; a consumer", _reader),
    RoleSpec(Role.INVITEE, "invitee (inside a join token)",
             "send one join request to `grid.enrol.join` (from the INVITEE account, which imports only that)",
             "everything else", _invitee),
)
_BY_ROLE = {spec.role: spec for spec in ROLES}


def grant_for(principal: Principal, user_public_key: str) -> Grant:
    return _BY_ROLE[principal.role].grant(principal, inbox_prefix(user_public_key))


# Placeholders the rendered table shows in place of a real host id and user key.
_DOC_HOST = "HOSTID"
_DOC_KEY = "UKEY"
_DOC_RANDOM = "RANDOM"


def _doc_subjects(subjects: tuple[str, ...]) -> str:
    shown = [s.replace(_DOC_HOST, "<id>").replace(_DOC_KEY, "<user key>").replace(_DOC_RANDOM, "<random>")
             for s in subjects]
    return "<br>".join(f"`{s}`" for s in shown) or "-"


def render_security_table() -> str:
    """The README's security table (markdown), generated from `ROLES` and the grants the server
    enforces (a reader is shown with every stream; its credential names the ones it gets)."""
    lines = ["| identity | may | may not | publish allow | subscribe allow |", "|---|---|---|---|---|"]
    for spec in ROLES:
        host = spec.role is Role.HOST
        principal = Principal(
            spec.role,
            host_id=_DOC_HOST if host else None,
            streams=ALL_STREAMS if spec.role is Role.READER else (),
            command_consumer=host_consumer_prefix(_DOC_HOST) + _DOC_RANDOM if host else None,
        )
        grant = spec.grant(principal, inbox_prefix(_DOC_KEY))
        lines.append(f"| {spec.who} | {spec.may} | {spec.may_not} | {_doc_subjects(grant.pub_allow)} "
                     f"| {_doc_subjects(grant.sub_allow)} |")
    return "\n".join(lines) + "\n"
