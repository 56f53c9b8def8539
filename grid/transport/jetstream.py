"""The JetStream EventLog: streams, idempotent appends, ordered replay, consumers, KV lease.

Receipt time is the server's message timestamp, parsed straight from the JetStream reply
subject (no per-message datetime objects on the replay hot path).

Losing the server: nats-py reconnects (unlimited attempts once connected) and re-sends SUB for
every inbox, but a restarted server has forgotten the ordered consumers behind those inboxes
(they live in memory). Every live subscription is therefore registered here and renewed on
reconnect: an ordered one restarts after the last message it handed out, a durable one checks
that its consumer still exists and re-creates it with the same configuration if not (the
subscription classes live in grid.transport.jetstream_consumers).

Replication: every stream and bucket is ensured with the replica count of the setting or of the
cluster's size, and drift is updated or reported (`StreamReplicas`). This keeps the file over
our usual 600 lines: creating a stream and choosing its replicas are one decision, made with
the same connection and the same server errors.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import ssl
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import msgspec
import nats
import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client as NATS
from nats.js import api

from grid.events.authorship import Authorship
from grid.events.log import (
    DUPLICATE_WINDOW_SECONDS,
    AppendResult,
    ConflictError,
    EventLogBase,
    KVEntry,
    LogError,
    StoredMessage,
)
from grid.events.subjects import (
    ALL_STREAMS,
    COMMANDS_STREAM,
    COMMANDS_VIEW_STREAM,
    CONTROL_STREAM,
    HOST_EVENT_KINDS,
    HOSTS_STREAM,
    LEASE_BUCKET,
    PLANS_STREAM,
    REQUESTS_STREAM,
    STREAM_SUBJECTS,
    stream_for_subject,
)
from grid.transport.direct_reads import DirectSubscription
from grid.transport.jetstream_consumers import (
    DurableSubscription,
    OrderedSubscription,
    unsubscribe,
)
from grid.transport.log_errors import WRONG_LAST_SEQUENCE, log_errors
from grid.transport.nats_failover import connect_client

log = structlog.get_logger(__name__)
T = TypeVar("T")

DAY = 86_400.0
GIB = 1 << 30
# JetStream API error codes Grid acts on.
JS_NO_SUITABLE_PEERS = 10005  # "no suitable peers for placement": fewer peers than replicas asked for
JS_STREAM_NAME_IN_USE = 10058  # "stream name already in use with a different configuration"
INITIAL_CONNECT_ATTEMPTS = 3
# How long stream setup waits for JetStream to answer for the account: a cluster that just
# started enables it only once its meta group has a leader (seen as 503 "JetStream not enabled
# for account" for a moment after every node reported healthy).
JETSTREAM_READY_SECONDS = 10.0
# A server that stops answering without closing its sockets (SIGSTOP, a partition, a hung host)
# is only noticed by unanswered pings: nats-py's default (two missed pings two minutes apart)
# would leave a component stuck for minutes instead of failing over to another cluster node.
# Two missed 1 s pings: a silent node is left within 3 s (grid.transport.nats_failover leaves it).
PING_INTERVAL_SECONDS = 1.0
MAX_OUTSTANDING_PINGS = 2
# The server's own report of its configuration; every server of a cluster answers.
VARZ_PING_SUBJECT = "$SYS.REQ.SERVER.PING.VARZ"
JS_API_PREFIX = "$JS.API"


class StreamPolicy(msgspec.Struct, frozen=True):
    max_age_seconds: float | None
    max_bytes: int
    # Keep at most this many messages per subject (None = unlimited); the oldest of the subject
    # goes first, so a writer of one subject can only ever push out that subject's own history.
    max_msgs_per_subject: int | None = None
    # The largest message (headers and payload) the stream stores (None = the server's limit).
    max_msg_size: int | None = None


KIB = 1 << 10
# Host isolation (issue 36: a host is a tenant, not a peer). A host may publish only its exact
# subjects (grid.identity.permissions), one per kind of host event, and they reach GRID_HOSTS
# only through the ingress, within the host's budget (grid.controller.ingress). Behind that, the
# second line: everything one host's subjects can ever hold in GRID_HOSTS is
# HOST_SUBJECT_HISTORY messages of at most HOST_EVENT_MAX_BYTES on each of them
# (`host_footprint_bytes`: 160 MiB). An honest agent's history is far smaller (heartbeats of
# a couple of KiB, acks of a few hundred bytes: TYPICAL_HOST_BYTES). While the stream's max_bytes
# holds one host's whole footprint beside every other host's history (`protected_hosts`: some
# 1,500 hosts at the default 2 GiB), the per-subject limit binds before the stream's byte limit
# does, and a flood on one host's subjects pushes out only that history, never another host's registration
# or acks (before, one host's 1 MiB messages filled the 2 GiB and the stream discarded everyone's
# oldest messages). Larger fleets keep working; status says when a fleet outgrows the guarantee.
# The history: every fold needs a host's latest registration, heartbeat and protection state,
# and the gateway's placed fold each (host, model)'s latest warm ack (`_scan_acks`); 512 acks are
# some 150 actions on one host since its oldest residency warmed, and 512 heartbeats some 17
# minutes of them at the agent's 2 s, enough for `gridctl replay` of the recent past from the log
# itself (older windows: the analytics store, `gridctl replay --source duckdb`).
HOST_SUBJECT_HISTORY = 512
# What an honest host's history takes: a heartbeat (~2 KiB with a few residencies and cached
# artifacts) and an ack (~0.5 KiB) per history slot; registrations, protection transitions and
# qualifications are rare and small.
TYPICAL_HOST_BYTES = HOST_SUBJECT_HISTORY * (2 * KIB + KIB // 2)
# The largest event a host may append (grid.identity.permissions says why 64 KiB).
HOST_EVENT_MAX_BYTES = 64 * KIB
# Control events (profiles, mode, overrides, revocations, route admissions) are small; anything
# far larger landing there is not one of ours.
CONTROL_EVENT_MAX_BYTES = 1 << 20


# Explicit retention: heartbeats and request features are bounded by age and bytes, host
# subjects also per subject (above). Control subjects keep a bounded history per subject (the
# latest profile/mode/override is the truth), so profiles never age out.
STREAM_POLICIES: dict[str, StreamPolicy] = {
    HOSTS_STREAM: StreamPolicy(max_age_seconds=7 * DAY, max_bytes=2 * GIB, max_msgs_per_subject=HOST_SUBJECT_HISTORY,
                               max_msg_size=HOST_EVENT_MAX_BYTES),
    REQUESTS_STREAM: StreamPolicy(max_age_seconds=7 * DAY, max_bytes=2 * GIB),
    CONTROL_STREAM: StreamPolicy(max_age_seconds=None, max_bytes=GIB // 4, max_msgs_per_subject=256,
                                 max_msg_size=CONTROL_EVENT_MAX_BYTES),
    PLANS_STREAM: StreamPolicy(max_age_seconds=30 * DAY, max_bytes=2 * GIB),
    COMMANDS_STREAM: StreamPolicy(max_age_seconds=30 * DAY, max_bytes=GIB),
}

MIB = 1 << 20
# The log budget: what every Grid stream together may hold on disk (the sum of their max_bytes,
# which the server reserves up front), split across them in STREAM_POLICIES' proportions; the
# commands mirror is a second copy of GRID_CMDS and sized like it. Without a budget the
# policies' own sizes (DEFAULT_LOG_BUDGET in all).
_POLICY_BYTES: dict[str, int] = {
    **{name: policy.max_bytes for name, policy in STREAM_POLICIES.items()},
    COMMANDS_VIEW_STREAM: STREAM_POLICIES[COMMANDS_STREAM].max_bytes,
}
DEFAULT_LOG_BUDGET = sum(_POLICY_BYTES.values())
MIN_LOG_BUDGET = 256 * MIB
# No stream is made smaller than this, whatever its share.
MIN_STREAM_BYTES = MIB


def host_footprint_bytes(policy: StreamPolicy | None = None) -> int:
    """The most one host can ever hold in GRID_HOSTS: its per-subject history of its largest
    events, on each of its exact subjects."""
    policy = policy or STREAM_POLICIES[HOSTS_STREAM]
    assert policy.max_msgs_per_subject is not None and policy.max_msg_size is not None
    return len(HOST_EVENT_KINDS) * policy.max_msgs_per_subject * policy.max_msg_size


def protected_hosts(hosts_max_bytes: int) -> int:
    """How many hosts a GRID_HOSTS of `hosts_max_bytes` holds at their full history beside one
    host at its full footprint: up to this many, the per-subject limits bind first and one host
    flooding its own subjects cannot push out another host's messages. 0: not even that."""
    return max(0, (hosts_max_bytes - host_footprint_bytes()) // TYPICAL_HOST_BYTES)


def stream_byte_limits(budget: int | None = None) -> dict[str, int]:
    """max_bytes of every stream (and the commands mirror) for a log budget in bytes."""
    if budget is None:
        return dict(_POLICY_BYTES)
    if budget < MIN_LOG_BUDGET:
        raise ValueError(f"a log budget of at least {MIN_LOG_BUDGET // MIB} MiB is needed, not {budget} bytes")
    return {name: max(MIN_STREAM_BYTES, budget * size // DEFAULT_LOG_BUDGET) for name, size in _POLICY_BYTES.items()}


_pub_ack_decoder = msgspec.json.Decoder(dict[str, Any])

# Replication (num_replicas of every stream and of the lease bucket). JetStream allows 1..5.
MAX_REPLICAS = 5
# On a cluster that can place this many the automatic choice is R3 (survives the loss of one
# node, and a quorum of two is still there); fewer peers get R1, since R2 tolerates no loss at all.
CLUSTER_REPLICAS = 3
# Outcomes of ensuring one stream's replica count (StreamReplicas.outcome).
REPLICAS_CREATED = "created"
REPLICAS_OK = "ok"
REPLICAS_UPDATED = "updated"
REPLICAS_MISMATCH = "mismatch"


class StreamReplicas(msgspec.Struct, frozen=True, kw_only=True):
    """What ensuring one stream (or the lease bucket's stream) did about its replica count."""

    stream: str
    wanted: int
    actual: int
    outcome: str
    # The exact command that fixes a mismatch the server refused to update (None otherwise).
    fix: str | None = None
    error: str | None = None


def check_replicas(value: int) -> int:
    if not 1 <= value <= MAX_REPLICAS:
        raise ValueError(f"replicas must be between 1 and {MAX_REPLICAS}, not {value}")
    return value


def fix_command(stream: str, replicas: int) -> str:
    return f"nats stream edit {stream} --replicas {replicas} --force"


class _VarzJetStreamConfig(msgspec.Struct):
    sync_always: bool = False


class _VarzJetStream(msgspec.Struct):
    config: _VarzJetStreamConfig | None = None


class _Varz(msgspec.Struct):
    jetstream: _VarzJetStream | None = None


class _VarzReply(msgspec.Struct):
    data: _Varz


_varz_decoder = msgspec.json.Decoder(_VarzReply)


# The consumers one grid stream may have: a host's command consumer each, plus the readers.
MAX_CONSUMERS_PER_STREAM = 1_000_000


def _stream_config(name: str, replicas: int = 1, max_bytes: int | None = None) -> api.StreamConfig:
    return api.StreamConfig(name=name, subjects=list(STREAM_SUBJECTS[name]),
                            duplicate_window=DUPLICATE_WINDOW_SECONDS,
                            **_retention(STREAM_POLICIES[name], replicas, max_bytes))


def _retention(policy: StreamPolicy, replicas: int, max_bytes: int | None) -> dict[str, Any]:
    """What every grid stream (and the commands mirror) keeps, and how it is stored."""
    return dict(
        retention=api.RetentionPolicy.LIMITS,
        storage=api.StorageType.FILE,
        discard=api.DiscardPolicy.OLD,
        max_age=policy.max_age_seconds,
        max_bytes=policy.max_bytes if max_bytes is None else max_bytes,
        max_msgs_per_subject=policy.max_msgs_per_subject or -1,
        max_msg_size=policy.max_msg_size or -1,
        # Every identity but the controller reads by direct gets (grid.transport.direct_reads),
        # from an account of its own: the answer lands there, never on a stream subject.
        allow_direct=True,
        num_replicas=replicas,
        # Stated, not left to the server: since nats-server 2.15 a stream that sets no limit gets
        # the server's default_max_consumers (1,000), and GRID_CMDS holds a durable consumer per
        # host, so the 1,000th host's consumer (and then the controller's own) was refused.
        max_consumers=MAX_CONSUMERS_PER_STREAM,
    )


def _view_config(replicas: int = 1, max_bytes: int | None = None) -> api.StreamConfig:
    """GRID_CMDS_VIEW: GRID_CMDS mirrored (same sequences, same retention), for every reader of
    commands but the controller (grid.events.subjects.COMMANDS_VIEW_STREAM)."""
    return api.StreamConfig(name=COMMANDS_VIEW_STREAM, mirror=api.StreamSource(name=COMMANDS_STREAM),
                            **_retention(STREAM_POLICIES[COMMANDS_STREAM], replicas, max_bytes))


class _Refused(Exception):
    """The server refused us in a way retrying cannot fix (raised from nats-py's error callback)."""


def _hopeless(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, ssl.SSLCertVerificationError) or "authorization violation" in text or "expired" in text


# What JetStreamLog.subscribe returns.
JetStreamSubscription = OrderedSubscription | DurableSubscription | DirectSubscription


class JetStreamLog(EventLogBase[JetStreamSubscription]):
    """EventLog over a real NATS JetStream server or cluster."""

    def __init__(self, nc: NATS, *, durable: bool = True, timeout: float = 10.0,
                 replicas: int | None = None, log_budget: int | None = None, api_prefix: str | None = None) -> None:
        self._nc = nc
        # Bytes all streams may hold together (stream_byte_limits); None: streams are created
        # at the policies' sizes, and an existing stream keeps the size it has (whoever set a
        # budget decided it, `gridctl up --log-budget`).
        self.log_budget = log_budget
        if log_budget is not None:
            stream_byte_limits(log_budget)  # refuses a budget below the minimum
        self._existing_max_bytes: dict[str, int] = {}
        # None: automatic (see wanted_replicas); a number: exactly that many, set by the operator.
        self.replicas = None if replicas is None else check_replicas(replicas)
        # What the last ensure_streams found and did about replica counts.
        self.replica_reports: tuple[StreamReplicas, ...] = ()
        # Where this connection's account reaches the JetStream API: `$JS.API`, or the prefix a
        # host's account imports it under (grid.identity.accounts).
        self._js = nc.jetstream(timeout=timeout, **({"prefix": api_prefix} if api_prefix else {}))
        self._api_prefix = api_prefix or JS_API_PREFIX
        # Replays and live tails by batched direct gets instead of ordered consumers: set by
        # grid.identity.connect for an identity in an account of its own (grid.transport.direct_reads).
        self.direct_reads = False
        self._timeout = timeout
        # Who this connection appends as; set by grid.identity.connect for an identity's log.
        self.authorship: Authorship | None = None
        # Streams whose ordered consumers (replay, live tail) read a mirror instead: an identity
        # other than the controller reads GRID_CMDS through GRID_CMDS_VIEW (set by
        # grid.identity.connect). Positions and StoredMessage.stream stay the stream's own.
        self.views: dict[str, str] = {}
        self._kv: dict[str, Any] = {}
        # The embedded server runs sync_interval: always; a caller that knows otherwise says so.
        self.durable = durable
        self.reconnects = 0
        self._outage_reported = False
        # Subscriptions to renew after a reconnect; a subscription leaves when it is closed
        # (or collected, if a caller forgets to close it).
        self._live: weakref.WeakSet[JetStreamSubscription] = weakref.WeakSet()
        # Called (synchronously, inside nats-py's reconnect task) when the connection is lost:
        # whoever holds state that cannot survive it (core request/reply in flight) fails it.
        self._disconnect_listeners: list[Callable[[], None]] = []
        # How `connect` made this connection (`sibling` opens another one the same way).
        self._connect_args: dict[str, Any] | None = None

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        name: str = "grid",
        durable: bool = True,
        nats_options: Mapping[str, Any] | None = None,
        ensure_streams: bool = True,
        replicas: int | None = None,
        timeout: float = 10.0,
        log_budget: int | None = None,
        api_prefix: str | None = None,
    ) -> "JetStreamLog":
        """Connect with extra nats-py options (an identity's credentials, inbox prefix and TLS:
        see grid.identity.connect). `ensure_streams=False` for identities that may not manage
        streams. `url` may list several servers of a cluster, comma-separated: nats-py tries
        them in turn and fails over between them. `replicas`: the streams' and lease bucket's
        replica count (None: 1 on a single server, 3 on a cluster of three or more).
        `api_prefix`: where the JetStream API is in this credential's account (None: `$JS.API`)."""
        if replicas is not None:
            check_replicas(replicas)
        errors: collections.deque[str] = collections.deque(maxlen=8)
        connected: list[JetStreamLog] = []
        servers = [u.strip() for u in url.split(",") if u.strip()]

        # nats-py awaits these callbacks inside its reconnect task: one that raises ends
        # reconnecting for good, and one that blocks stalls it. They only log and flag.
        async def on_error(exc: Exception) -> None:
            errors.append(f"{type(exc).__name__}: {exc}")
            # While the server is down every reconnect attempt (two a second) fails: say it
            # once per outage, and keep the rest for debugging.
            if connected and connected[0]._outage_reported:
                log.debug("nats connection error", url=url, error=errors[-1])
                return
            if connected:
                connected[0]._outage_reported = True
            if connected or len(servers) == 1:
                log.warning("nats connection error", url=url, error=errors[-1])
            # else: one node of a cluster down is what the list is for: the next is tried, and if
            # none answers, the LogError below says why (and a CLI's --json output stays clean).
            # Before the first connection, a certificate that does not verify or a refused
            # credential cannot get better by retrying; raising here makes nats-py give up at
            # once (after such a TLS failure its own retry can hang closing the transport).
            if not connected and _hopeless(exc):
                raise _Refused(errors[-1]) from exc

        identity = {"ping_interval": PING_INTERVAL_SECONDS, "max_outstanding_pings": MAX_OUTSTANDING_PINGS,
                    **(nats_options or {})}

        async def on_disconnected() -> None:
            if connected and not (connected[0].client.is_closed or connected[0].client.is_draining):
                log.warning("nats disconnected; reconnecting", url=url)
            if connected:
                connected[0]._disconnected()

        async def on_reconnected() -> None:
            if connected:
                connected[0]._reconnected()

        try:
            # A bounded first connection (nats-py would otherwise retry it forever), then
            # unlimited reconnects once we have been connected.
            nc = await connect_client(
                servers=servers,
                name=name,
                connect_timeout=5,
                max_reconnect_attempts=INITIAL_CONNECT_ATTEMPTS,
                reconnect_time_wait=0.5,
                error_cb=on_error,
                disconnected_cb=on_disconnected,
                reconnected_cb=on_reconnected,
                **identity,
            )
        except _Refused as exc:
            raise LogError(f"cannot connect to NATS at {url}: {exc}") from exc
        except Exception as exc:  # nats raises several unrelated types for "cannot connect"
            # The server's refusal (-ERR 'Authorization Violation') and the reset that follows it
            # race; the refusal is the one that tells the user what to fix.
            refusals = [e for e in errors if "authorization" in e.lower() or "expired" in e.lower()]
            detail = refusals[-1] if refusals else errors[-1] if errors else str(exc) or type(exc).__name__
            raise LogError(f"cannot connect to NATS at {url}: {detail}") from exc
        nc.options["max_reconnect_attempts"] = -1
        try:
            event_log = cls(nc, durable=durable, replicas=replicas, timeout=timeout, log_budget=log_budget,
                            api_prefix=api_prefix)
        except ValueError:
            await nc.close()
            raise
        connected.append(event_log)
        event_log._connect_args = {"url": url, "nats_options": nats_options, "durable": durable, "timeout": timeout,
                                   "api_prefix": api_prefix}
        if ensure_streams:
            try:
                await event_log.ensure_streams()
            except BaseException:
                await event_log.close()  # a log that cannot set up its streams is not handed out
                raise
        return event_log

    async def sibling(self, name: str) -> "JetStreamLog | None":
        """Another connection to the same servers as the same identity, for traffic that must not
        queue on this connection's socket behind, or ahead of, the log's own (the controller's
        ingress of every host's appends). None for a log `connect` did not make."""
        if self._connect_args is None:
            return None
        return await type(self).connect(**self._connect_args, name=name, ensure_streams=False)

    def add_disconnect_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener()` each time the connection is lost (before reconnecting). It runs
        inside nats-py's reconnect task: it must not block, and what it raises is only logged."""
        self._disconnect_listeners.append(listener)

    def remove_disconnect_listener(self, listener: Callable[[], None]) -> None:
        if listener in self._disconnect_listeners:
            self._disconnect_listeners.remove(listener)

    def _disconnected(self) -> None:
        for listener in list(self._disconnect_listeners):
            try:
                listener()
            except Exception as exc:  # noqa: BLE001 - must never end nats-py's reconnecting
                log.error("nats disconnect listener failed", error=f"{type(exc).__name__}: {exc}")

    def _reconnected(self) -> None:
        """Renew every live subscription (runs inside nats-py's reconnect task: must not block)."""
        self.reconnects += 1
        self._outage_reported = False
        live = list(self._live)
        log.info("nats reconnected; renewing subscriptions", subscriptions=len(live), reconnects=self.reconnects)
        for sub in live:
            sub.renew()

    @property
    def client(self) -> NATS:
        return self._nc

    @property
    def api_prefix(self) -> str:
        """Where this connection's account reaches the JetStream API."""
        return self._api_prefix

    @property
    def request_timeout(self) -> float:
        return self._timeout

    @property
    def jetstream(self) -> Any:
        """The JetStream context this log speaks through (its account's API prefix)."""
        return self._js

    def hosts_capacity(self) -> int:
        """How many hosts GRID_HOSTS protects from one flooding host (`protected_hosts` of its
        max_bytes, as the last ensure_streams set or found it)."""
        if self.log_budget is None and self._existing_max_bytes.get(HOSTS_STREAM, -1) > 0:
            return protected_hosts(self._existing_max_bytes[HOSTS_STREAM])
        return protected_hosts(stream_byte_limits(self.log_budget)[HOSTS_STREAM])

    async def server_syncs_always(self, *, timeout: float = 1.0, linger: float = 0.25) -> bool | None:
        """Whether every server that answers fsyncs each write (JetStream `sync_interval: always`).

        Only a server's VARZ tells, and over NATS only to the system account or an account that
        imports the service. None: no server answered this connection, so its durability is not
        known (an ordinary account gets "no responders"). Replies are gathered for `linger`
        seconds after the first, so every server of a cluster counts.
        """
        loop = asyncio.get_running_loop()
        inbox = self._nc.new_inbox()
        sub = await self._nc.subscribe(inbox)
        verdicts: list[bool] = []
        try:
            await self._nc.publish(VARZ_PING_SUBJECT, b"", reply=inbox)
            deadline = loop.time() + timeout
            while (remaining := deadline - loop.time()) > 0:
                try:
                    msg = await sub.next_msg(timeout=remaining)
                except nats.errors.TimeoutError:
                    break
                if not msg.data:  # a status message: no responders
                    break
                try:
                    js = _varz_decoder.decode(msg.data).data.jetstream
                except msgspec.DecodeError:
                    continue
                verdicts.append(bool(js and js.config and js.config.sync_always))
                deadline = min(deadline, loop.time() + linger)
        finally:
            await unsubscribe(sub)
        return all(verdicts) if verdicts else None

    def clustered(self) -> bool:
        """Whether the connected server is a node of a cluster: its INFO names one, or lists
        other servers' client URLs (a suite run once saw a node of a healthy 3-node cluster
        answer as a single server, and the streams came out R1; which field was missing was
        not recorded)."""
        info = getattr(self._nc, "_server_info", None) or {}  # nats-py keeps INFO only here
        return bool(info.get("cluster")) or len(info.get("connect_urls") or ()) > 1

    def wanted_replicas(self, actual: int | None = None) -> int:
        """The replica count to ask for: the setting, else automatic, never below what an existing
        stream already has (an automatic choice does not shrink what an operator grew).

        Automatic is CLUSTER_REPLICAS on a cluster, and JetStream's placement has the last word
        (see `create_replicated`): it knows every peer, while the server's INFO lists only the
        nodes it has routes to so far, which right after a cluster starts can be fewer than it has
        (and none at all with `no_advertise`).
        """
        if self.replicas is not None:
            return self.replicas
        return max(CLUSTER_REPLICAS if self.clustered() else 1, actual or 0)

    def _unplaceable(self, exc: nats.js.errors.APIError, wanted: int) -> bool:
        """An automatic replica count the cluster has too few JetStream peers to place."""
        return self.replicas is None and wanted > 1 and exc.err_code == JS_NO_SUITABLE_PEERS

    async def create_replicated(self, create: Callable[[int], Awaitable[T]]) -> tuple[T, int]:
        """`create(replicas)` of a missing stream or bucket with the wanted replica count; an
        automatic count the cluster cannot place is created with one replica instead. Returns
        what `create` returned and the count it was created with."""
        wanted = self.wanted_replicas()
        try:
            return await create(wanted), wanted
        except nats.js.errors.APIError as exc:
            if not self._unplaceable(exc, wanted):
                raise
        return await create(1), 1

    async def ensure_streams(self, replicas: int | None = None) -> tuple[StreamReplicas, ...]:
        """Create every stream (and the lease bucket) idempotently, updating drifted config.

        Replica counts are updated where the server allows it (NATS 2.10+ changes a stream's
        num_replicas in place); a refusal is reported, with the command that fixes it, in the
        returned reports (also kept in `replica_reports` and logged), never silently left.
        """
        if replicas is not None:
            self.replicas = check_replicas(replicas)
        limits = stream_byte_limits(self.log_budget)
        reports = [await self._ensure_stream(_stream_config(name, max_bytes=limits[name])) for name in ALL_STREAMS]
        commands = reports[ALL_STREAMS.index(COMMANDS_STREAM)]
        reports.append(await self._ensure_view(rebuild=commands.outcome == REPLICAS_CREATED))
        await self._bucket(LEASE_BUCKET)
        reports.append(await self.ensure_replicas(f"KV_{LEASE_BUCKET}"))
        self.replica_reports = tuple(reports)
        for r in self.replica_reports:
            if r.outcome == REPLICAS_MISMATCH:
                log.warning("stream replica count differs from the setting", stream=r.stream, wanted=r.wanted,
                            actual=r.actual, fix=r.fix, error=r.error)
            elif r.outcome == REPLICAS_UPDATED:
                log.info("stream replica count updated", stream=r.stream, replicas=r.wanted)
        return self.replica_reports

    async def _ensure_view(self, *, rebuild: bool) -> StreamReplicas:
        """The commands mirror, made anew along with GRID_CMDS (`rebuild`), or when it holds more
        than GRID_CMDS (the stream was deleted and made anew elsewhere): a mirror would go on
        from its own last sequence, and its sequences would no longer be GRID_CMDS's."""
        try:
            view = await self._js.stream_info(COMMANDS_VIEW_STREAM)
        except nats.js.errors.NotFoundError:
            view = None
        if view is not None:
            source = await self._js.stream_info(COMMANDS_STREAM)
            if rebuild or int(view.state.last_seq) > int(source.state.last_seq):
                if not rebuild:
                    log.warning("commands mirror is ahead of GRID_CMDS (the stream was made anew); rebuilding it",
                                mirror_last=view.state.last_seq, last=source.state.last_seq)
                await self._js.delete_stream(COMMANDS_VIEW_STREAM)
        return await self._ensure_stream(_view_config(max_bytes=stream_byte_limits(self.log_budget)[COMMANDS_VIEW_STREAM]))

    async def _stream_replicas(self, name: str) -> int | None:
        deadline = asyncio.get_running_loop().time() + JETSTREAM_READY_SECONDS
        while True:
            try:
                info = await self._js.stream_info(name)
            except nats.js.errors.NotFoundError:
                return None
            except nats.js.errors.ServiceUnavailableError as exc:
                if asyncio.get_running_loop().time() < deadline:
                    await asyncio.sleep(0.25)
                    continue
                where = self._nc.connected_url.netloc if self._nc.connected_url else "the server"
                raise LogError(
                    f"JetStream does not answer for this account at {where} after {JETSTREAM_READY_SECONDS:g}s "
                    f"({exc.description or 'service unavailable'}): run nats-server with JetStream enabled "
                    "(-js, or `jetstream` in its config and in the account's limits)"
                ) from exc
            if info.config.max_bytes is not None:
                self._existing_max_bytes[name] = int(info.config.max_bytes)
            return int(info.config.num_replicas or 1)

    async def _ensure_stream(self, config: api.StreamConfig) -> StreamReplicas:
        name = config.name or ""
        actual = await self._stream_replicas(name)
        if actual is None:
            return await self._create_stream(config)
        wanted = self.wanted_replicas(actual)
        config.num_replicas = wanted
        if self.log_budget is None and self._existing_max_bytes.get(name, -1) > 0:
            config.max_bytes = self._existing_max_bytes[name]  # sized by a log budget: kept
        try:
            await self._js.add_stream(config)  # identical config: accepted as is
            return StreamReplicas(stream=name, wanted=wanted, actual=wanted, outcome=REPLICAS_OK)
        except nats.js.errors.APIError:  # "already in use with a different configuration", or worse
            pass
        try:
            await self._js.update_stream(config)
        except nats.js.errors.APIError as exc:
            if actual == wanted:
                raise
            # Keep the replica count the server has, still fix the rest of the configuration.
            config.num_replicas = actual
            await self._js.update_stream(config)
            return self._refused(name, wanted, actual, exc)
        return StreamReplicas(stream=name, wanted=wanted, actual=wanted,
                              outcome=REPLICAS_OK if actual == wanted else REPLICAS_UPDATED)

    async def _create_stream(self, config: api.StreamConfig) -> StreamReplicas:
        name = config.name or ""

        async def create(replicas: int) -> None:
            config.num_replicas = replicas
            await self._js.add_stream(config)

        try:
            _, replicas = await self.create_replicated(create)
        except nats.js.errors.APIError as exc:
            if exc.err_code == JS_STREAM_NAME_IN_USE:  # created meanwhile by another controller
                return await self._ensure_stream(config)
            raise LogError(f"cannot create stream {name} with {config.num_replicas} replicas: "
                           f"{exc.description}") from exc
        return StreamReplicas(stream=name, wanted=replicas, actual=replicas, outcome=REPLICAS_CREATED)

    def _refused(self, name: str, wanted: int, actual: int, exc: nats.js.errors.APIError) -> StreamReplicas:
        """What a refused replica update of a stream leaves: as it is, and the command that fixes
        it; but an automatic count the cluster cannot place is no mismatch."""
        if self._unplaceable(exc, wanted):
            return StreamReplicas(stream=name, wanted=actual, actual=actual, outcome=REPLICAS_OK)
        return StreamReplicas(stream=name, wanted=wanted, actual=actual, outcome=REPLICAS_MISMATCH,
                              fix=fix_command(name, wanted), error=exc.description)

    async def ensure_replicas(self, name: str) -> StreamReplicas:
        """Only the replica count of a stream whose other settings someone else owns (a KV or
        object store bucket)."""
        info = await self._js.stream_info(name)
        config = info.config
        actual = int(config.num_replicas or 1)
        wanted = self.wanted_replicas(actual)
        if actual == wanted:
            return StreamReplicas(stream=name, wanted=wanted, actual=actual, outcome=REPLICAS_OK)
        config.num_replicas = wanted
        try:
            await self._js.update_stream(config)
        except nats.js.errors.APIError as exc:
            return self._refused(name, wanted, actual, exc)
        return StreamReplicas(stream=name, wanted=wanted, actual=wanted, outcome=REPLICAS_UPDATED)

    async def _bucket(self, bucket: str) -> Any:
        kv = self._kv.get(bucket)
        if kv is None:
            try:
                kv = await self._js.key_value(bucket)
            except nats.js.errors.BucketNotFoundError:
                kv, _ = await self.create_replicated(lambda replicas: self._js.create_key_value(
                    api.KeyValueConfig(bucket=bucket, history=16, storage=api.StorageType.FILE, replicas=replicas)))
            # nats-py reads a key with a direct get when the bucket allows them; its stream
            # message get is the one a host may use (grid.identity.permissions).
            kv._direct = False
            self._kv[bucket] = kv
        return kv

    def _append_headers(self, msg_id: str | None, expected_last_subject_seq: int | None) -> dict[str, str]:
        """The server drops a repeated Nats-Msg-Id within the stream's duplicate window, and checks
        the subject's last sequence."""
        headers: dict[str, str] = {}
        if msg_id is not None:
            headers["Nats-Msg-Id"] = msg_id
        if expected_last_subject_seq is not None:
            headers["Nats-Expected-Last-Subject-Sequence"] = str(expected_last_subject_seq)
        return headers

    async def _store(self, subject: str, data: bytes, headers: dict[str, str] | None, *, msg_id: str | None,
                     expected_last_subject_seq: int | None) -> AppendResult:
        # msg_id and the expected sequence travel in `headers` (_append_headers).
        with log_errors(f"append to {subject}"):
            reply = await self._nc.request(subject, data, timeout=self._timeout, headers=headers)
        resp = _pub_ack_decoder.decode(reply.data)
        error = resp.get("error")
        if error:
            if error.get("err_code") == WRONG_LAST_SEQUENCE:
                raise ConflictError(f"{subject}: {error.get('description')}")
            raise LogError(f"append to {subject} failed: {error.get('description')} ({error.get('err_code')})")
        return AppendResult(resp["stream"], int(resp["seq"]), bool(resp.get("duplicate", False)))

    async def _retrying(self, call: Any, attempts: int = 3) -> Any:
        """A JetStream API call, tried again when it times out: on a cluster a stream whose
        leader just died answers nothing until its peers elect a new one (a few seconds)."""
        for attempt in range(attempts):
            try:
                return await call()
            except nats.errors.TimeoutError:
                if attempt == attempts - 1:
                    raise
                log.info("jetstream api call timed out; retrying (stream leader election?)", attempt=attempt + 1)
                await asyncio.sleep(0.5)
        raise AssertionError("unreachable")

    async def last_sequence(self, stream: str) -> int:
        info = await self._retrying(lambda: self._js.stream_info(stream))
        return int(info.state.last_seq)

    async def last_message(self, subject: str) -> StoredMessage | None:
        """The last message on `subject`, by a stream message get (`$JS.API.STREAM.MSG.GET`,
        never a direct get: grid.identity.permissions says why), answered by the stream's leader."""
        stream = stream_for_subject(subject)
        try:
            msg = await self._js.get_last_msg(stream, subject)
        except nats.js.errors.NotFoundError:
            return None
        headers = msg.headers or {}
        return StoredMessage(stream, int(msg.seq or 0), msg.subject or subject, msg.data or b"",
                             msg.time.timestamp() if msg.time is not None else 0.0,
                             headers.get("Nats-Msg-Id"), dict(headers) or None)

    async def _ordered(
        self,
        stream: str,
        *,
        start_seq: int | None,
        start_time: float | None,
        subject_filter: str | None = None,
    ) -> Any:
        if start_time is not None:
            config = api.ConsumerConfig(
                deliver_policy=api.DeliverPolicy.BY_START_TIME,
                opt_start_time=dt.datetime.fromtimestamp(start_time, dt.timezone.utc).isoformat(),  # type: ignore[arg-type]
            )
        elif start_seq is None:
            config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.NEW)
        else:
            config = api.ConsumerConfig(
                deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(1, start_seq)
            )
        subject = subject_filter or STREAM_SUBJECTS[stream][0]
        source = self.views.get(stream, stream)
        sub = await self._retrying(lambda: self._js.subscribe(
            subject,
            stream=source,
            ordered_consumer=True,
            config=config,
            pending_msgs_limit=1_000_000,
            pending_bytes_limit=1 << 30,
        ))
        jsi = getattr(sub._sub, "_jsi", None)
        if start_seq is not None and start_time is None and jsi is not None and jsi._sseq == 0:
            # nats-py's own ordered reset (after two missed idle heartbeats) restarts after the
            # last stream sequence it saw, which it starts at 0: a reset before the first message
            # would replay the stream from its beginning.
            jsi._sseq = max(1, start_seq) - 1
        return sub

    async def _follow(self, stream: str, *, start_seq: int | None, start_time: float | None = None,
                      subject_filter: str | None = None) -> OrderedSubscription | DirectSubscription:
        """From `start_time` if given, else from `start_seq`: by direct gets for an identity in
        an account of its own, else by an ordered consumer."""
        if self.direct_reads:
            direct = DirectSubscription(self, stream, source=self.views.get(stream, stream),
                                        start_seq=None if start_time is not None else max(1, start_seq or 1),
                                        start_time=start_time, subject_filter=subject_filter)
            self._live.add(direct)
            return direct
        sub = await self._ordered(stream, start_seq=start_seq, start_time=start_time, subject_filter=subject_filter)
        ordered = OrderedSubscription(self, stream, sub, start_seq=start_seq, start_time=start_time,
                                      subject_filter=subject_filter)
        self._live.add(ordered)
        return ordered

    async def _extent(self, stream: str) -> tuple[int, int]:
        info = await self._retrying(lambda: self._js.stream_info(stream))
        last = int(info.state.last_seq)
        # Empty is told by the count: a stream that never held a message reports first 0, not 1.
        return (int(info.state.first_seq) if int(info.state.messages) else last + 1), last

    async def _read(self, stream: str, *, start_seq: int | None,
                    start_time: float | None) -> AsyncGenerator[StoredMessage, None]:
        sub = await self._follow(stream, start_seq=start_seq, start_time=start_time)
        try:
            # The deadline only matters when the queue is empty (when we would block), so the
            # tail of a window whose last message has gone ends the replay instead of hanging it.
            while (msg := await sub.next(self._timeout)) is not None:
                yield msg
        finally:
            await sub.close()

    async def _durable(self, stream: str, durable: str, *, start_seq: int | None,
                       subject_filter: str | None) -> DurableSubscription:
        config = api.ConsumerConfig(
            durable_name=durable,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=30.0,
            max_ack_pending=1024,
            deliver_policy=(
                api.DeliverPolicy.BY_START_SEQUENCE if start_seq else api.DeliverPolicy.ALL
            ),
            opt_start_seq=start_seq or None,
            filter_subject=subject_filter or None,
        )
        sub = await self._js.pull_subscribe(
            subject_filter or STREAM_SUBJECTS[stream][0], durable=durable, stream=stream, config=config
        )
        pull = DurableSubscription(self, stream, sub, durable=durable, config=config)
        self._live.add(pull)
        return pull

    async def kv_get(self, bucket: str, key: str) -> KVEntry | None:
        with log_errors(f"kv {bucket}/{key}"):
            kv = await self._bucket(bucket)
            try:
                entry = await kv.get(key)
            except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
                return None
        return KVEntry(key, entry.value or b"", int(entry.revision or 0))

    async def kv_put(
        self, bucket: str, key: str, value: bytes, *, expected_revision: int | None = None
    ) -> int:
        with log_errors(f"kv {bucket}/{key}", conflict=f"revision is not {expected_revision}"):
            kv = await self._bucket(bucket)
            if expected_revision is None:
                return int(await kv.put(key, value))
            if expected_revision == 0:
                return int(await kv.create(key, value))
            return int(await kv.update(key, value, last=expected_revision))

    async def kv_entries(self, bucket: str, pattern: str = ">") -> list[tuple[KVEntry, float | None]]:
        """The current entry of every key matching `pattern`, with the server's time of it
        (deleted keys left out). A short-lived watcher: for small buckets read now and then."""
        with log_errors(f"listing kv {bucket}/{pattern}"):
            kv = await self._bucket(bucket)
            watcher = await kv.watch(pattern, ignore_deletes=True)
        out: list[tuple[KVEntry, float | None]] = []
        try:
            while True:
                with log_errors(f"listing kv {bucket}/{pattern}"):
                    entry = await watcher.updates(timeout=self._timeout)
                if entry is None:  # the end of the current values
                    return out
                created = entry.created
                at = created.timestamp() if isinstance(created, dt.datetime) else None
                out.append((KVEntry(entry.key, entry.value or b"", int(entry.revision or 0)), at))
        finally:
            await watcher.stop()

    async def close(self) -> None:
        # A reader that stopped reading (a cancelled task, Ctrl-C) leaves delivered messages
        # queued on its subscription, and drain() waits for every queue to empty (up to its
        # 30 s timeout). The log's own subscriptions keep nothing worth that wait: an ordered
        # one's position lives with its caller, a durable one hands unacked messages back on
        # close. So they end first, and drain() only flushes what was published.
        for sub in list(self._live):
            try:
                await sub.close()
            except Exception as exc:  # noqa: BLE001 - closing anyway; the connection goes next
                log.debug("subscription close failed while closing the log", error=f"{type(exc).__name__}: {exc}")
        if not self._nc.is_closed:
            try:
                await self._nc.drain()
            except Exception:  # already closing or disconnected: nothing left to flush
                await self._nc.close()
