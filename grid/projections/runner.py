"""Keeps projection states and stream positions together; catches up, follows, snapshots.

Each stream is folded in order. A malformed or unknown-tag message is counted and skipped by
live folding (visible in `malformed`), and makes strict replay fail with its sequence number.
An event the subject it was stored under does not vouch for (`unvouched`, reason
`subject_mismatch`) is rejected: the server checks who may publish on a subject, never the
payload, so a host's heartbeat naming another host on its own subject must not be folded as the
other's.
On a log opened as an identity (a credential), every message must also prove its author: the
producer's signature over the subject it is stored under, by a key the grid's account issued,
not revoked before this point of the log, for a principal the permission table lets write that
subject (grid.identity.signing). A message that does not is skipped and counted by reason in
`rejected` (never folded, never fatal, not even in strict replay, which lists it instead).
A `CredentialRevoked` revokes its keys from its own position in the fold order on, so a replay
judges every message exactly as the live fold did.
A heartbeat proven its host's is still rejected (`stale_replay`, `signed_ahead`, counted the
same way) unless its signed time is newer than the host's last folded heartbeat and within the
allowed skew of its receipt time (grid.events.authorship.heartbeat_replay): a stored heartbeat
published again never turns into a plan change. The rule reads only the message's signed time
and receipt time and the heartbeats folded before it, so replay gives the same verdicts.
Before any of that, a hosts-stream message must be within its host's budget (grid.projections.
budget: token buckets over receipt times, on whenever authorship is verified): one over it is
dropped at the cost of a subject split and a little arithmetic, counted by reason (`over_rate`,
`over_bytes`) beside the rejections, and its host flagged; its signature is never checked. The
live follower drops before it hands a batch's signatures to a worker thread, so a flooding host
costs the fold almost nothing and honest heartbeats behind its flood are folded promptly.
Rejection and skip log lines are rate-limited per host and reason (`LogThrottle`).
A corrupt snapshot is quarantined with a warning and the state is rebuilt from the log; so is a
snapshot that does not describe the log it is restored against (`restore_snapshot`): a position
past a stream's last sequence, or a folded message the stream no longer holds as recorded (the
stream was deleted and created again).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import structlog

from grid.events import codec
from grid.events.authorship import SIG_HEADER, Authorship, AuthorshipGate, Signed, check_signatures
from grid.events.base import Event
from grid.events.codec import EventDecodeError
from grid.events.control import CredentialRevoked
from grid.events.host import HostHeartbeat
from grid.events.log import EventLog, StoredMessage
from grid.identity.provenance import SUBJECT_MISMATCH, vouched_for
from grid.events.subjects import (
    COMMANDS_STREAM,
    CONTROL_STREAM,
    HOSTS_STREAM,
    PLANS_STREAM,
    REQUESTS_STREAM,
)
from grid.projections import actions, catalog, fleet, placed, plans
from grid.projections.budget import BudgetState, HostBudget, LogThrottle, host_token
from grid.projections.position import Position

log = structlog.get_logger(__name__)

SNAPSHOT_VERSION = 1
# Messages whose signatures a catch-up checks at once on a worker thread.
SIGNATURE_BATCH = 256
# The most messages a live follower takes from one stream at once (what has arrived), whose
# signatures a worker thread checks in one call.
FOLLOW_BATCH = 256
# Catch-up order: commands before host acks, control before everything that depends on it.
STREAM_ORDER: tuple[str, ...] = (CONTROL_STREAM, COMMANDS_STREAM, PLANS_STREAM, HOSTS_STREAM, REQUESTS_STREAM)


async def merge_by_receipt_time(iterators: Mapping[str, AsyncIterator[StoredMessage]]) -> AsyncIterator[StoredMessage]:
    """The messages of several streams in receipt-time order, ties in STREAM_ORDER (a k-way merge).

    This is the interleaving a live follower sees, so folds that read another projection (demand
    reads the catalog) give the same state after a catch-up or a replay as they did live. The
    caller owns the iterators (and closes them).
    """
    rank = {stream: i for i, stream in enumerate(STREAM_ORDER)}
    heap: list[tuple[float, int, int, StoredMessage]] = []
    for stream, it in iterators.items():
        msg = await anext(it, None)
        if msg is not None:
            heap.append((msg.time, rank[stream], msg.seq, msg))
    heapq.heapify(heap)
    while heap:
        _, r, _, msg = heap[0]
        yield msg
        nxt = await anext(iterators[msg.stream], None)
        if nxt is None:
            heapq.heappop(heap)
        else:
            heapq.heapreplace(heap, (nxt.time, r, nxt.seq, nxt))


class ReplayError(RuntimeError):
    def __init__(self, stream: str, seq: int, reason: str) -> None:
        super().__init__(f"{stream} sequence {seq}: {reason}")
        self.stream = stream
        self.seq = seq
        self.reason = reason


@dataclass(frozen=True)
class ProjectionSpec:
    """One projection: its name, the streams it folds, its fold and its state type.

    ``apply(state, event, position, states)`` receives the other projections' current states
    read-only, for folds that depend on them (demand only counts configured models).

    ``in_place``: the fold mutates the state it is given (demand and throughput update their
    buckets in place: copying them per request would cost more than the fold). Such a state is
    copied when it is held (`ProjectionRunner.hold`); every other fold returns a new state and
    never changes one it returned before, so holding it is holding a reference.
    """

    name: str
    streams: tuple[str, ...]
    state_type: type
    initial: Callable[[], Any]
    apply: Callable[[Any, Event, Position, dict[str, Any]], Any]
    in_place: bool = False


class Held(msgspec.Struct, frozen=True):
    """Projection states and the stream positions they were folded to, as of one instant: what a
    worker thread may read while the loop goes on folding (`ProjectionRunner.hold`)."""

    states: Mapping[str, Any]
    positions: Mapping[str, int]


def copy_state(state: Any) -> Any:
    """An independent copy of a projection state (typed msgpack round trip: exact for the
    structs, dicts, lists, tuples and floats projection states are made of, and keeps dict order;
    a SharedMap goes through as a dict and its state converts it back)."""
    return msgspec.msgpack.decode(msgspec.msgpack.encode(state, enc_hook=codec.builtin_value), type=type(state))


def _simple(name: str, streams: tuple[str, ...], module: Any, state_type: type) -> ProjectionSpec:
    fold = module.apply
    return ProjectionSpec(name, streams, state_type, module.initial, lambda s, e, p, _states: fold(s, e, p))


FLEET = _simple("fleet", (HOSTS_STREAM, CONTROL_STREAM), fleet, fleet.FleetState)
CATALOG = _simple("catalog", (CONTROL_STREAM,), catalog, catalog.CatalogState)
ACTIONS = _simple("actions", (COMMANDS_STREAM, HOSTS_STREAM), actions, actions.ActionsState)
PLANS = _simple("plans", (PLANS_STREAM,), plans, plans.PlansState)
# What the controller placed (the latest plan) and the hosts confirmed (warm acks): the
# gateway routes a managed residency only when both hold (grid.projections.placed).
PLACED = _simple("placed", (PLANS_STREAM, HOSTS_STREAM), placed, placed.PlacedState)
# The controller's fold of the same projection also sees the warms it commanded (GRID_CMDS, which
# no other identity may consume), so it can tell which confirmations name a real command.
PLACED_CONTROL = _simple("placed", (COMMANDS_STREAM, PLANS_STREAM, HOSTS_STREAM), placed, placed.PlacedState)
CORE_PROJECTIONS: tuple[ProjectionSpec, ...] = (CATALOG, FLEET, ACTIONS, PLANS)


class _Snapshot(msgspec.Struct):
    version: int
    positions: dict[str, int]
    states: dict[str, msgspec.Raw]
    malformed: int = 0
    # Receipt time of the message at each position: identifies the stream's incarnation.
    last_time: dict[str, float] = {}
    # Revoked signer keys -> "<stream>:<seq>" of the revocation; rejections by reason.
    revoked: dict[str, str] = {}
    rejected: dict[str, int] = {}
    # Host id -> signed time of its last folded heartbeat (the freshness rule's memory). Absent
    # from snapshots written before the rule: taken from the fleet state's heartbeats then.
    heartbeats: dict[str, float] | None = None
    # The host budgets' buckets and drops (grid.projections.budget), when budgets were on.
    budget: BudgetState | None = None


def _folded_heartbeats(fleet_state: Any) -> dict[str, float]:
    """Host id -> signed time of the heartbeat a fleet state holds for it: what an older snapshot
    (written before the runner kept this itself) knows of each host's last folded heartbeat."""
    if not isinstance(fleet_state, fleet.FleetState):
        return {}
    return {host_id: record.heartbeat.at for host_id, record in sorted(fleet_state.hosts.items())
            if record.heartbeat is not None}


class ProjectionRunner:
    def __init__(self, specs: Sequence[ProjectionSpec] = CORE_PROJECTIONS, *, strict: bool = False,
                 authorship: Authorship | None = None, budget: HostBudget | bool = True) -> None:
        self.specs = tuple(specs)
        self.strict = strict
        # Verifies authorship when set (taken from the log on the first catch-up or follow).
        self.gate = AuthorshipGate(authorship)
        # Host budgets on the hosts stream: True: on as soon as authorship is verified (a grid
        # with identities; without them anyone may write anything and there is nothing to
        # bound); False: off; a HostBudget: that one, always.
        self._budget_auto = budget is True
        self._budget: HostBudget | None = budget if isinstance(budget, HostBudget) else None
        # Log lines about skipped messages, at most one per host and reason every few seconds.
        self.log_throttle = LogThrottle()
        self.states: dict[str, Any] = {s.name: s.initial() for s in self.specs}
        self.positions: dict[str, int] = {}
        self.last_time: dict[str, float] = {}
        self.malformed = 0
        self.malformed_last: tuple[str, int, str] | None = None
        # Events skipped because their subject does not vouch for them (also counted in malformed).
        self.unvouched = 0
        self.warnings: list[str] = []
        self._by_stream: dict[str, tuple[ProjectionSpec, ...]] = {}
        for stream in STREAM_ORDER:
            self._by_stream[stream] = tuple(s for s in self.specs if stream in s.streams)
        self.changed = asyncio.Event()

    @property
    def streams(self) -> tuple[str, ...]:
        return tuple(s for s in STREAM_ORDER if self._by_stream.get(s))

    def __getitem__(self, name: str) -> Any:
        return self.states[name]

    def hold(self) -> Held:
        """The states and positions as of now, safe to read on another thread while this one
        keeps folding: states whose fold mutates in place are copied, the others are immutable.
        Synchronous, so no fold can land between the states and the positions."""
        states = {s.name: copy_state(self.states[s.name]) if s.in_place else self.states[s.name]
                  for s in self.specs}
        return Held(states=states, positions=dict(self.positions))

    @property
    def budget(self) -> HostBudget | None:
        if self._budget is None and self._budget_auto and self.gate.authorship is not None:
            self._budget = HostBudget()
        return self._budget

    def admit(self, msg: StoredMessage) -> str | None:
        """Charge `msg` to its host's budget: None when within it, else the reason it is dropped.
        Call once per message, in stream order, and only for a message not folded yet."""
        if msg.stream != HOSTS_STREAM:
            return None
        budget = self.budget
        if budget is None:
            return None
        headers = msg.headers
        return budget.admit(msg.subject, len(msg.data), msg.time, signed=bool(headers) and SIG_HEADER in headers)

    def admit_batch(self, messages: Sequence[StoredMessage]) -> list[str | None]:
        """`admit` for each message of a batch not yet folded (one stream's, in order)."""
        positions = self.positions
        return [self.admit(m) if m.seq > positions.get(m.stream, 0) else None for m in messages]

    def fold(self, msg: StoredMessage, *, signature_ok: bool | None = None, admitted: bool = False) -> bool:
        """Fold one stored message. Returns False when it was skipped as malformed, rejected or
        over its host's budget.

        `signature_ok`: its signature, when already checked (`catch_up` checks them in batches).
        `admitted`: its budget was already charged (`admit`) and it is within it."""
        if msg.seq <= self.positions.get(msg.stream, 0):
            return True  # already folded (snapshot overlap or redelivery)
        if not admitted:
            over = self.admit(msg)
            if over is not None:
                return self.drop(msg, over)
        verdict = self.gate.check(msg.stream, msg.seq, msg.subject, msg.data, msg.headers, msg.time,
                                  signature_ok=signature_ok)
        if not verdict.ok:
            return self._rejected(msg, verdict)
        try:
            event = codec.decode(msg.data)
        except EventDecodeError as exc:
            return self._skip(msg, exc.reason, exc)
        if not vouched_for(msg, event):
            self.unvouched += 1
            mismatch = Signed(reason=SUBJECT_MISMATCH, signer=verdict.signer, role=verdict.role)
            self.gate.reject(msg.stream, msg.seq, msg.subject, mismatch)
            return self._rejected(msg, mismatch)
        if isinstance(event, HostHeartbeat):
            fresh = self.gate.fresh_heartbeat(msg.stream, msg.seq, msg.subject, event.host_id, event.at, msg.time,
                                              verdict)
            if not fresh.ok:
                return self._rejected(msg, fresh)
        if isinstance(event, CredentialRevoked):
            self.gate.revoke(event.keys, f"{msg.stream}:{msg.seq}")
        self.fold_event(event, Position(msg.stream, msg.seq, msg.time))
        return True

    def drop(self, msg: StoredMessage, reason: str) -> bool:
        """Skip a message over its host's budget (`admit` flagged the host). Counted and listed
        with the rejections, so status, metrics and replay's list of rejected events show it."""
        self.gate.reject(msg.stream, msg.seq, msg.subject, Signed(reason=reason))
        self._throttled("dropped event over its host's budget", msg, reason)
        self.positions[msg.stream] = msg.seq
        self.last_time[msg.stream] = msg.time
        return False

    def _throttled(self, what: str, msg: StoredMessage, reason: str, **fields: Any) -> None:
        """One warning line per host (or stream) and reason every few seconds of receipt time,
        saying how many were suppressed since the last."""
        source = host_token(msg.subject) or msg.stream
        ok, suppressed = self.log_throttle.allow((source, reason), msg.time)
        if ok:
            log.warning(what, stream=msg.stream, seq=msg.seq, subject=msg.subject, reason=reason,
                        suppressed=suppressed or None, **fields)

    def _rejected(self, msg: StoredMessage, verdict: Signed) -> bool:
        """Skip a message whose author is not proven (the gate counted it); replay lists it and
        carries on."""
        self._throttled("rejected unproven event", msg, verdict.reason, signer=verdict.signer or None)
        self.positions[msg.stream] = msg.seq
        self.last_time[msg.stream] = msg.time
        return False

    @property
    def rejected(self) -> dict[str, int]:
        """Messages skipped as not provably their author's, or over their host's budget, by reason."""
        return self.gate.rejected

    def _skip(self, msg: StoredMessage, reason: str, cause: Exception | None = None) -> bool:
        if self.strict:
            raise ReplayError(msg.stream, msg.seq, reason) from cause
        self.malformed += 1
        self.malformed_last = (msg.stream, msg.seq, reason)
        self._throttled("skipped malformed event", msg, reason)
        self.positions[msg.stream] = msg.seq
        self.last_time[msg.stream] = msg.time
        return False

    def fold_aside(self, msg: StoredMessage, names: Sequence[str]) -> bool:
        """Fold one stored message into the named projections only, checked exactly as `fold`
        checks it, leaving every stream position as it is: for a side replay of an older part of
        a stream into folds whose result does not depend on order (the gateway scans the hosts
        stream's older acks for `placed` beside its recent tail). False: skipped."""
        verdict = self.gate.check(msg.stream, msg.seq, msg.subject, msg.data, msg.headers, msg.time)
        if not verdict.ok:
            return False
        try:
            event = codec.decode(msg.data)
        except EventDecodeError:
            return False
        if not vouched_for(msg, event):
            self.unvouched += 1
            self.gate.reject(msg.stream, msg.seq, msg.subject,
                             Signed(reason=SUBJECT_MISMATCH, signer=verdict.signer, role=verdict.role))
            return False
        position = Position(msg.stream, msg.seq, msg.time)
        for spec in self._by_stream.get(msg.stream, ()):
            if spec.name in names:
                self.states[spec.name] = spec.apply(self.states[spec.name], event, position, self.states)
        return True

    def fold_event(self, event: Event, position: Position) -> None:
        states = self.states
        for spec in self._by_stream.get(position.stream, ()):
            states[spec.name] = spec.apply(states[spec.name], event, position, states)
        self.positions[position.stream] = position.seq
        self.last_time[position.stream] = position.time

    async def catch_up(self, log_: EventLog, *, end: dict[str, int] | None = None,
                       progress: Callable[[str, int], None] | None = None) -> int:
        """Fold everything each stream holds now (or up to `end[stream]`). Returns events folded.

        Streams are merged by receipt time (ties in STREAM_ORDER), the order a live follower
        sees: folds that read another projection (demand reads the catalog) then give the same
        state after a restart as they did live.
        """
        self._adopt_authorship(log_)
        iterators: dict[str, Any] = {}
        for stream in self.streams:
            start = self.positions.get(stream, 0) + 1
            stop = None if end is None else end.get(stream)
            if stop is None or stop >= start:
                iterators[stream] = log_.replay(stream, start_seq=start, end_seq=stop).__aiter__()
        folded = 0
        authorship = self.gate.authorship
        loop = asyncio.get_running_loop()
        batch: list[StoredMessage] = []
        # Budget verdicts of `batch`, charged as each message arrived (in stream order).
        drops: list[str | None] = []
        # The batch whose signatures a worker thread is checking while the one before is folded.
        checking: tuple[list[StoredMessage], list[str | None], asyncio.Future[list[bool | None]]] | None = None

        def fold_all(messages: list[StoredMessage], signatures: list[bool | None],
                     over: list[str | None] | None = None) -> None:
            nonlocal folded
            checked = iter(signatures)
            for i, msg in enumerate(messages):
                reason = over[i] if over is not None else None
                if reason is not None:
                    self.drop(msg, reason)
                else:
                    self.fold(msg, signature_ok=next(checked), admitted=over is not None)
                folded += 1
                if progress is not None:
                    progress(msg.stream, msg.seq)

        async def pipeline(messages: list[StoredMessage], over: list[str | None]) -> None:
            """Start checking the signatures of `messages` within budget, then fold the batch
            checked before."""
            nonlocal checking
            previous, checking = checking, None
            if messages:
                assert authorship is not None
                within = [m for m, reason in zip(messages, over) if reason is None]
                authorship.prime(m.headers for m in within)
                items = [(m.subject, m.data, m.headers) for m in within]
                checking = (messages, over, loop.run_in_executor(None, authorship.signatures, items))
            if previous is not None:
                fold_all(previous[0], await previous[2], previous[1])

        merged = merge_by_receipt_time(iterators)
        try:
            async for msg in merged:
                if authorship is None:
                    fold_all([msg], [None])
                    continue
                # Signatures are most of a verified catch-up's CPU, and libsodium releases the
                # GIL: a worker checks one batch while this thread folds the one before it.
                # Revocations and permissions are still judged here, in fold order.
                batch.append(msg)
                # Charged now, in stream order: an over-budget message never reaches the worker.
                drops.append(self.admit(msg) if msg.seq > self.positions.get(msg.stream, 0) else None)
                if len(batch) >= SIGNATURE_BATCH:
                    await pipeline(batch, drops)
                    batch, drops = [], []
            if authorship is not None:
                await pipeline(batch, drops)
                await pipeline([], [])
        finally:
            await merged.aclose()
            for it in iterators.values():
                await it.aclose()
        if folded:
            self.changed.set()
        return folded

    async def follow(self, log_: EventLog, *, on_fold: Callable[[str, StoredMessage], None] | None = None) -> None:
        """Follow every stream live (ordered consumers) until cancelled.

        Every subscription opened is closed, even when the task is cancelled while subscribing
        (a leaked consumer makes the client's drain hang), and one failing close does not keep
        the others open.
        """
        self._adopt_authorship(log_)
        subs: list[Any] = []

        async def pump(sub: Any) -> None:
            while True:
                msg = await sub.next(timeout=None)
                if msg is None:
                    return
                # What has arrived meanwhile, up to a batch: its signatures are checked in one
                # call on a worker thread (libsodium releases the GIL), and the loop serves
                # everything else while they are. Folded here, in order, as one by one.
                batch = [msg]
                while len(batch) < FOLLOW_BATCH:
                    more = await sub.next(timeout=0)
                    if more is None:
                        break
                    batch.append(more)
                # Budgets first (cheap, in order): a flooding host's messages are dropped here and
                # never cost a signature check, a decode or a fold.
                over = self.admit_batch(batch)
                within = [m for m, reason in zip(batch, over) if reason is None]
                checked = iter(await check_signatures(self.gate.authorship, within))
                for m, reason in zip(batch, over):
                    if reason is not None:
                        self.drop(m, reason)
                        continue
                    self.fold(m, signature_ok=next(checked), admitted=True)
                    if on_fold is not None:
                        on_fold(m.stream, m)
                self.changed.set()

        try:
            # Subscribing inside the try: a cancellation half way still closes what was opened.
            for stream in self.streams:
                subs.append(await log_.subscribe(stream, start_seq=self.positions.get(stream, 0) + 1))
            await asyncio.gather(*(pump(s) for s in subs))
        finally:
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.close()

    def _adopt_authorship(self, log_: EventLog) -> None:
        # A log opened as an identity verifies for its readers; one without identities cannot.
        if self.gate.authorship is None:
            self.gate.authorship = getattr(log_, "authorship", None)

    # --- snapshots -------------------------------------------------------------------------

    def snapshot_bytes(self) -> bytes:
        snap = _Snapshot(
            version=SNAPSHOT_VERSION,
            positions=dict(sorted(self.positions.items())),
            states={s.name: msgspec.Raw(codec.encode_value(self.states[s.name])) for s in self.specs},
            malformed=self.malformed,
            last_time=dict(sorted(self.last_time.items())),
            revoked=dict(sorted(self.gate.revoked.items())),
            rejected=dict(sorted(self.gate.rejected.items())),
            heartbeats=dict(sorted(self.gate.heartbeats.items())),
            budget=self._budget.state if self._budget is not None else None,
        )
        return codec.encode_value(snap)

    def restore_bytes(self, data: bytes) -> None:
        snap = msgspec.json.decode(data, type=_Snapshot)
        if snap.version != SNAPSHOT_VERSION:
            raise ValueError(f"snapshot version {snap.version} is not {SNAPSHOT_VERSION}")
        states: dict[str, Any] = {}
        for spec in self.specs:
            raw = snap.states.get(spec.name)
            if raw is None:
                raise ValueError(f"snapshot has no state for projection {spec.name!r}")
            states[spec.name] = msgspec.json.decode(raw, type=spec.state_type)
        self.states = states
        self.positions = dict(snap.positions)
        self.last_time = dict(snap.last_time)
        self.malformed = snap.malformed
        self.gate.revoked = dict(snap.revoked)
        self.gate.rejected = dict(snap.rejected)
        if snap.budget is not None and (self._budget_auto or self._budget is not None):
            policy = self._budget.policy if self._budget is not None else None
            self._budget = HostBudget(policy, snap.budget)
        self.gate.heartbeats = (dict(snap.heartbeats) if snap.heartbeats is not None
                                else _folded_heartbeats(states.get(FLEET.name)))

    def save_snapshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            f.write(self.snapshot_bytes())
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)

    def load_snapshot(self, path: Path) -> bool:
        """Restore from `path`. A corrupt file is quarantined, warned about, and ignored."""
        if not path.exists():
            return False
        try:
            self.restore_bytes(path.read_bytes())
            return True
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            self._discard(path, "corrupt", str(exc))
            return False

    async def restore_snapshot(self, path: Path, log_: EventLog) -> bool:
        """Restore from `path` if the snapshot still describes `log_`; otherwise start empty.

        A snapshot whose position is past a stream's last sequence would make every later event
        up to that position invisible (folding skips what it believes it has seen), and one taken
        from an earlier incarnation of a stream would do the same with events it never saw. Such
        a snapshot is quarantined with a warning and the state is rebuilt from the log.
        """
        if not self.load_snapshot(path):
            return False
        problem = await self._mismatch(log_)
        if problem is None:
            return True
        self._discard(path, "stale", problem)
        return False

    async def _mismatch(self, log_: EventLog) -> str | None:
        for stream, position in sorted(self.positions.items()):
            if position <= 0:
                continue
            try:
                last = await log_.last_sequence(stream)
            except Exception as exc:  # an absent stream holds nothing the snapshot could describe
                return f"{stream}: cannot read its last sequence ({type(exc).__name__}: {exc})"
            if position > last:
                return f"{stream}: position {position} is past the stream's last sequence {last}"
            recorded = self.last_time.get(stream)
            if recorded is None:
                continue  # written before receipt times were kept: the sequence check is all we have
            messages = log_.replay(stream, start_seq=position, end_seq=position)
            try:
                held = await anext(aiter(messages), None)
            finally:
                await messages.aclose()  # type: ignore[attr-defined]
            # A message removed by retention cannot be compared; a different one at that
            # sequence means the stream was created again since the snapshot.
            if held is not None and held.seq == position and held.time != recorded:
                return (f"{stream}: sequence {position} was received at {held.time}, not at {recorded} as "
                        "recorded (another incarnation of the stream)")
        return None

    def _discard(self, path: Path, kind: str, reason: str) -> None:
        quarantine = path.with_name(f"{path.name}.{kind}-{int(time.time())}")
        os.replace(path, quarantine)
        warning = f"{kind} projection snapshot quarantined to {quarantine}: {reason}; rebuilt from the log"
        self.warnings.append(warning)
        log.warning("snapshot quarantined", path=str(quarantine), kind=kind, error=reason)
        self.states = {s.name: s.initial() for s in self.specs}
        self.positions = {}
        self.last_time = {}
        self.malformed = 0
        self.gate.reset()
        if self._budget is not None:
            self._budget = HostBudget(self._budget.policy)
