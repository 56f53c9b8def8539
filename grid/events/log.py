"""The EventLog protocol, EventLogBase, and InMemoryLog, the in-process twin of the JetStream log.

Both implementations (InMemoryLog here, grid.transport.jetstream.JetStreamLog) are built on
EventLogBase and pass one contract suite (tests/contract/). The in-memory log exists for the
scenario lab and fast unit tests; anything that claims durability uses JetStream.
"""

from __future__ import annotations

import asyncio
import bisect
from abc import abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Generic, Protocol, TypeVar

import msgspec

from grid.clock import Clock, SystemClock
from grid.events import codec
from grid.events.authorship import Authorship
from grid.events.base import Event
from grid.events.subjects import ALL_STREAMS, stream_for_subject, subject_for

DUPLICATE_WINDOW_SECONDS = 120.0


class StoredMessage(msgspec.Struct, frozen=True):
    stream: str
    seq: int
    subject: str
    data: bytes
    # Receipt time on the log's clock (JetStream server timestamp), seconds since the epoch.
    time: float
    msg_id: str | None = None
    # The message's headers as stored (its producer's signature among them), None when it has none.
    headers: dict[str, str] | None = None


class AppendResult(msgspec.Struct, frozen=True):
    stream: str
    seq: int
    duplicate: bool = False


class KVEntry(msgspec.Struct, frozen=True):
    key: str
    value: bytes
    revision: int


class LogError(RuntimeError):
    pass


class ConflictError(LogError):
    """An optimistic-concurrency check failed (stale expected sequence or KV revision)."""


class Subscription(Protocol):
    async def next(self, timeout: float | None = None) -> StoredMessage | None: ...

    async def ack(self, message: StoredMessage) -> None: ...

    async def close(self) -> None: ...

    def __aiter__(self) -> AsyncIterator[StoredMessage]: ...


class IteratedByNext:
    """`async for` over a subscription's `next()` until it ends (None), and no acknowledgement
    (a durable subscription overrides `ack`): what every log's subscriptions share."""

    async def next(self, timeout: float | None = None) -> StoredMessage | None:
        raise NotImplementedError

    async def ack(self, message: StoredMessage) -> None:
        return None

    async def __aiter__(self) -> AsyncIterator[StoredMessage]:
        while True:
            msg = await self.next()
            if msg is None:
                return
            yield msg


class EventLog(Protocol):
    durable: bool
    # Who this log appends as (it signs every append) and verifies for; None without identities.
    authorship: Authorship | None

    async def append(
        self,
        event: Event,
        *,
        expected_last_subject_seq: int | None = None,
    ) -> AppendResult: ...

    async def append_raw(
        self,
        subject: str,
        data: bytes,
        *,
        msg_id: str | None = None,
        expected_last_subject_seq: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> AppendResult: ...

    async def last_sequence(self, stream: str) -> int: ...

    async def last_subject_sequence(self, subject: str) -> int: ...

    # The last message stored under exactly `subject` (a host reads back its own events this
    # way: it may not replay a whole stream). None when there is none.
    async def last_message(self, subject: str) -> StoredMessage | None: ...

    def replay(
        self,
        stream: str,
        *,
        start_seq: int = 1,
        start_time: float | None = None,
        end_seq: int | None = None,
        end_time: float | None = None,
    ) -> AsyncIterator[StoredMessage]: ...

    async def subscribe(
        self,
        stream: str,
        *,
        start_seq: int | None = None,
        durable: str | None = None,
        subject_filter: str | None = None,
    ) -> Subscription: ...

    async def kv_get(self, bucket: str, key: str) -> KVEntry | None: ...

    async def kv_put(
        self, bucket: str, key: str, value: bytes, *, expected_revision: int | None = None
    ) -> int: ...

    async def close(self) -> None: ...


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching (``*`` one token, ``>`` the rest)."""
    p_tokens = pattern.split(".")
    s_tokens = subject.split(".")
    for i, tok in enumerate(p_tokens):
        if tok == ">":
            return len(s_tokens) > i
        if i >= len(s_tokens):
            return False
        if tok != "*" and tok != s_tokens[i]:
            return False
    return len(p_tokens) == len(s_tokens)


SubscriptionT = TypeVar("SubscriptionT", bound=Subscription)


class EventLogBase(EventLog, Generic[SubscriptionT]):
    """What every EventLog does the same way whatever stores it: an event's subject, bytes and
    msg_id, signing each append, the window a replay covers, and where a subscription starts.

    An implementation writes only its storage and its wire: the hooks below (`_store`,
    `_extent`, `_read`, `_follow`, `_durable`), `last_sequence`, `last_message`, `kv_get` and
    `kv_put`, and `close` if it holds anything. `SubscriptionT` is what its `subscribe` returns.
    It subclasses the EventLog protocol so that mypy checks the shared methods against it.
    """

    async def append(self, event: Event, *, expected_last_subject_seq: int | None = None) -> AppendResult:
        return await self.append_raw(
            subject_for(event),
            codec.encode(event),
            msg_id=event.event_id,
            expected_last_subject_seq=expected_last_subject_seq,
        )

    async def append_raw(
        self,
        subject: str,
        data: bytes,
        *,
        msg_id: str | None = None,
        expected_last_subject_seq: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> AppendResult:
        """Store `data` under `subject` with a copy of `headers`, signed by `authorship` if any.

        The headers go in this order: the caller's, then `_append_headers`, then the signature
        (last, so a caller's header can never stand in for it)."""
        headers = {**(headers or {}), **self._append_headers(msg_id, expected_last_subject_seq)}
        if self.authorship is not None:
            headers.update(self.authorship.sign(subject, data))
        return await self._store(subject, data, headers or None, msg_id=msg_id,
                                 expected_last_subject_seq=expected_last_subject_seq)

    def _append_headers(self, msg_id: str | None, expected_last_subject_seq: int | None) -> dict[str, str]:
        """Headers that carry `msg_id` and `expected_last_subject_seq` to a store that checks them
        on receipt; none by default, for a log that checks them itself in `_store`."""
        return {}

    @abstractmethod
    async def _store(self, subject: str, data: bytes, headers: dict[str, str] | None, *, msg_id: str | None,
                     expected_last_subject_seq: int | None) -> AppendResult:
        """Store one message: dropped as a duplicate when `msg_id` was stored within the
        duplicate window, refused (ConflictError) when the subject's last sequence is not
        `expected_last_subject_seq`."""

    async def last_subject_sequence(self, subject: str) -> int:
        msg = await self.last_message(subject)
        return msg.seq if msg is not None else 0

    async def replay(
        self,
        stream: str,
        *,
        start_seq: int = 1,
        start_time: float | None = None,
        end_seq: int | None = None,
        end_time: float | None = None,
    ) -> AsyncIterator[StoredMessage]:
        """Ordered replay of what the stream holds now, from `start_time` if given, else from
        `start_seq`, to `end_seq` and `end_time` (both inclusive). Nothing when `end_seq` or the
        stream's last message comes before `start_seq` (even with a `start_time`)."""
        first, last = await self._extent(stream)
        stop = last if end_seq is None else min(end_seq, last)
        if stop < max(start_seq, first):
            return  # nothing in the window: no reader is opened (on JetStream, no consumer)
        reader = self._read(stream, start_seq=start_seq if start_time is None else None, start_time=start_time)
        # Closed as soon as the window ends, not when the reader is collected.
        async with aclosing(reader) as messages:
            async for msg in messages:
                if msg.seq > stop or (end_time is not None and msg.time > end_time):
                    return
                yield msg
                if msg.seq >= stop:
                    return

    @abstractmethod
    async def _extent(self, stream: str) -> tuple[int, int]:
        """The first and last sequence `stream` holds now (first > last: it holds nothing)."""

    @abstractmethod
    def _read(self, stream: str, *, start_seq: int | None,
              start_time: float | None) -> AsyncGenerator[StoredMessage, None]:
        """The stream in order from `start_time` if given, else from `start_seq`, ending when it
        has nothing more to hand out."""

    async def subscribe(
        self,
        stream: str,
        *,
        start_seq: int | None = None,
        durable: str | None = None,
        subject_filter: str | None = None,
    ) -> SubscriptionT:
        if durable is not None:
            return await self._durable(stream, durable, start_seq=start_seq, subject_filter=subject_filter)
        if start_seq is None:
            # "New messages only" as a position, so a subscription that is renewed (JetStream,
            # after a server restart) resumes where it stood instead of skipping what arrived.
            start_seq = await self.last_sequence(stream) + 1
        return await self._follow(stream, start_seq=start_seq, subject_filter=subject_filter)

    @abstractmethod
    async def _follow(self, stream: str, *, start_seq: int, subject_filter: str | None) -> SubscriptionT:
        """A live subscription from `start_seq` whose position lives with the caller."""

    @abstractmethod
    async def _durable(self, stream: str, durable: str, *, start_seq: int | None,
                       subject_filter: str | None) -> SubscriptionT:
        """The subscription of the durable consumer `durable`, created from `start_seq` (None:
        the stream's first message) if new; acknowledged messages are not handed out again."""

    async def close(self) -> None:
        return None


class _MemoryStream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.messages: list[StoredMessage] = []
        self.seqs: list[int] = []
        self.last_seq = 0
        self.last_by_subject: dict[str, int] = {}
        self.msg_ids: dict[str, tuple[int, float]] = {}
        self.changed = asyncio.Event()


class InMemoryLog(EventLogBase["_MemorySubscription"]):
    """A faithful in-process model of the JetStream contract (not durable)."""

    durable = False

    def __init__(self, clock: Clock | None = None, *, authorship: Authorship | None = None) -> None:
        self._clock = clock or SystemClock()
        self.authorship = authorship
        self._streams = {name: _MemoryStream(name) for name in ALL_STREAMS}
        self._durables: dict[tuple[str, str], int] = {}
        self._kv: dict[tuple[str, str], KVEntry] = {}
        self._kv_rev: dict[str, int] = {}

    async def _store(self, subject: str, data: bytes, headers: dict[str, str] | None, *, msg_id: str | None,
                     expected_last_subject_seq: int | None) -> AppendResult:
        stream = self._streams[stream_for_subject(subject)]
        now = self._clock.now()
        if msg_id is not None:
            seen = stream.msg_ids.get(msg_id)
            if seen is not None and now - seen[1] <= DUPLICATE_WINDOW_SECONDS:
                return AppendResult(stream.name, seen[0], duplicate=True)
        if expected_last_subject_seq is not None:
            actual = stream.last_by_subject.get(subject, 0)
            if actual != expected_last_subject_seq:
                raise ConflictError(
                    f"wrong last sequence for {subject}: expected {expected_last_subject_seq}, is {actual}"
                )
        # Receipt times never go backwards within a stream, as on a real server.
        if stream.messages:
            now = max(now, stream.messages[-1].time)
        stream.last_seq += 1
        seq = stream.last_seq
        stream.messages.append(StoredMessage(stream.name, seq, subject, bytes(data), now, msg_id, headers))
        stream.seqs.append(seq)
        stream.last_by_subject[subject] = seq
        if msg_id is not None:
            stream.msg_ids[msg_id] = (seq, now)
        stream.changed.set()
        stream.changed = asyncio.Event()
        return AppendResult(stream.name, seq)

    async def last_sequence(self, stream: str) -> int:
        return self._streams[stream].last_seq

    async def last_message(self, subject: str) -> StoredMessage | None:
        stream = self._streams[stream_for_subject(subject)]
        seq = stream.last_by_subject.get(subject, 0)
        if not seq:
            return None
        i = bisect.bisect_left(stream.seqs, seq)
        return stream.messages[i] if i < len(stream.seqs) and stream.seqs[i] == seq else None

    async def _extent(self, stream: str) -> tuple[int, int]:
        s = self._streams[stream]
        return (s.seqs[0] if s.seqs else s.last_seq + 1), s.last_seq

    async def _read(self, stream: str, *, start_seq: int | None,
                    start_time: float | None) -> AsyncGenerator[StoredMessage, None]:
        s = self._streams[stream]
        if start_time is not None:
            i = next((i for i, msg in enumerate(s.messages) if msg.time >= start_time), len(s.messages))
        else:
            i = bisect.bisect_left(s.seqs, start_seq or 1)
        # The list as it grows: what is appended while the replay runs is read too (up to its end).
        while i < len(s.messages):
            yield s.messages[i]
            i += 1

    async def _follow(self, stream: str, *, start_seq: int, subject_filter: str | None) -> _MemorySubscription:
        return _MemorySubscription(self, self._streams[stream], start_seq, subject_filter, None)

    async def _durable(self, stream: str, durable: str, *, start_seq: int | None,
                       subject_filter: str | None) -> _MemorySubscription:
        s = self._streams[stream]
        key = (stream, durable)
        if key not in self._durables:
            self._durables[key] = (start_seq or 1) - 1
        return _MemorySubscription(self, s, self._durables[key] + 1, subject_filter, durable)

    async def kv_get(self, bucket: str, key: str) -> KVEntry | None:
        return self._kv.get((bucket, key))

    async def kv_put(
        self, bucket: str, key: str, value: bytes, *, expected_revision: int | None = None
    ) -> int:
        current = self._kv.get((bucket, key))
        if expected_revision is not None:
            actual = current.revision if current else 0
            if actual != expected_revision:
                raise ConflictError(f"kv {bucket}/{key}: expected revision {expected_revision}, is {actual}")
        rev = self._kv_rev.get(bucket, 0) + 1
        self._kv_rev[bucket] = rev
        self._kv[(bucket, key)] = KVEntry(key, bytes(value), rev)
        return rev

    def _durable_ack(self, stream: str, durable: str, seq: int) -> None:
        key = (stream, durable)
        self._durables[key] = max(self._durables.get(key, 0), seq)


class _MemorySubscription(IteratedByNext):
    def __init__(
        self,
        log: InMemoryLog,
        stream: _MemoryStream,
        next_seq: int,
        subject_filter: str | None,
        durable: str | None,
    ) -> None:
        self._log = log
        self._stream = stream
        self._next_seq = next_seq
        self._filter = subject_filter
        self._durable = durable
        self._closed = False

    async def next(self, timeout: float | None = None) -> StoredMessage | None:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not self._closed:
            s = self._stream
            i = bisect.bisect_left(s.seqs, self._next_seq)
            while i < len(s.messages):
                msg = s.messages[i]
                self._next_seq = msg.seq + 1
                if self._filter is None or subject_matches(self._filter, msg.subject):
                    return msg
                i += 1
            waiter = s.changed
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return None
            try:
                await asyncio.wait_for(waiter.wait(), remaining)
            except TimeoutError:
                return None
        return None

    async def ack(self, message: StoredMessage) -> None:
        if self._durable is not None:
            self._log._durable_ack(self._stream.name, self._durable, message.seq)

    async def close(self) -> None:
        self._closed = True
