"""The controller lease against a real nats-server: acquire, renew, expiry, races, release.

Each lease has its own connection and its own simulated clock, as two controller processes
would: expiry is judged on each one's monotonic clock, so advancing one clock is one process
waiting. Races are real interleavings: `CompetingWrite` runs a real competitor's step between
the holder's read of the KV entry and its write.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
import pytest

from grid.clock import SimulatedClock
from grid.controller.lease import HELD, LOST, STANDBY, Lease
from grid.events.lease import LEASE_KEY, LeaseRecord
from grid.events.log import KVEntry
from grid.events.subjects import LEASE_BUCKET
from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import JetStreamLog

TTL = 15.0


class CompetingWrite:
    """The real log; once armed, `race` runs right after the next read of the lease entry."""

    def __init__(self, inner: JetStreamLog) -> None:
        self._inner = inner
        self.race: Callable[[], Awaitable[object]] | None = None

    async def kv_get(self, bucket: str, key: str) -> KVEntry | None:
        entry = await self._inner.kv_get(bucket, key)
        race, self.race = self.race, None
        if race is not None:
            await race()
        return entry

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


@pytest.fixture
async def other_log(nats_server: EmbeddedNats, js_log: JetStreamLog) -> AsyncIterator[JetStreamLog]:
    """A second controller's own connection (js_log has already reset the lease bucket)."""
    log = await JetStreamLog.connect(nats_server.url)
    try:
        yield log
    finally:
        await log.close()


async def stored(log: JetStreamLog) -> tuple[LeaseRecord, int]:
    entry = await log.kv_get(LEASE_BUCKET, LEASE_KEY)
    assert entry is not None
    return msgspec.json.decode(entry.value, type=LeaseRecord), entry.revision


def lease(log: object, controller_id: str) -> tuple[Lease, SimulatedClock]:
    clock = SimulatedClock()
    return Lease(log, controller_id, ttl_seconds=TTL, margin_seconds=1.0, clock=clock), clock  # type: ignore[arg-type]


async def test_first_step_acquires_term_one_and_a_second_controller_stands_by(
    js_log: JetStreamLog, other_log: JetStreamLog
) -> None:
    a, _ = lease(js_log, "ctl-a")
    b, _ = lease(other_log, "ctl-b")
    assert await a.step()
    assert a.state == HELD and a.held and a.term == 1 and a.takeovers == 1
    record, revision = await stored(js_log)
    assert (record.controller_id, record.term, record.released) == ("ctl-a", 1, False)
    assert a.revision == revision
    assert not await b.step()
    assert b.state == STANDBY and not b.held and b.term == 0
    assert (b.holder_id, b.holder_term) == ("ctl-a", 1)


async def test_renewal_keeps_the_term_moves_the_revision_and_resets_the_standby_wait(
    js_log: JetStreamLog, other_log: JetStreamLog
) -> None:
    a, a_clock = lease(js_log, "ctl-a")
    b, b_clock = lease(other_log, "ctl-b")
    assert await a.step()
    assert not await b.step()
    first_revision = a.revision
    for _ in range(3):
        # Two thirds of a TTL on both clocks, then a renewal: the standby never sees one
        # revision for a whole TTL, so it never takes over.
        a_clock.advance(TTL * 2 / 3)
        b_clock.advance(TTL * 2 / 3)
        assert await a.step()
        assert not await b.step()
    assert a.term == 1 and a.takeovers == 1 and a.revision > first_revision
    assert a.remaining() == pytest.approx(TTL)
    record, revision = await stored(js_log)
    assert (record.controller_id, record.term, revision) == ("ctl-a", 1, a.revision)
    assert b.state == STANDBY and b.term == 0


async def test_a_silent_holder_is_taken_over_after_one_ttl_with_the_next_term(
    js_log: JetStreamLog, other_log: JetStreamLog
) -> None:
    a, a_clock = lease(js_log, "ctl-a")
    b, b_clock = lease(other_log, "ctl-b")
    assert await a.step()
    assert not await b.step()
    # Just short of a TTL of watching one revision: still the holder's.
    b_clock.advance(TTL - 0.5)
    assert not await b.step()
    b_clock.advance(0.5)
    assert await b.step()
    assert b.held and b.term == a.term + 1 == 2
    record, _ = await stored(js_log)
    assert (record.controller_id, record.term) == ("ctl-b", 2)
    # The old holder's authority ran out on its own clock; its next step sees the new holder
    # and steps down without writing.
    a_clock.advance(TTL)
    assert not a.held
    assert not await a.step()
    assert a.state == LOST and a.term == 1
    assert not await a.verify()
    record, revision = await stored(js_log)
    assert (record.controller_id, record.term, revision) == ("ctl-b", 2, b.revision)


async def test_a_competing_write_between_read_and_write_makes_the_holder_step_down(
    js_log: JetStreamLog, other_log: JetStreamLog
) -> None:
    racing = CompetingWrite(js_log)
    a, _ = lease(racing, "ctl-a")
    b, b_clock = lease(other_log, "ctl-b")
    assert await a.step()
    assert not await b.step()
    # By b's own clock the revision it watched has lapsed (a long pause of a, as b sees it).
    b_clock.advance(TTL)
    took_over: list[bool] = []

    async def b_takes_over() -> None:
        took_over.append(await b.step())

    # a reads its own record, b takes over, then a writes its renewal against the revision it read.
    racing.race = b_takes_over
    assert not await a.step()
    assert took_over == [True]
    assert a.state == LOST and not a.held and a.remaining() == 0.0
    assert a.last_error is not None and "raced" in a.last_error
    record, revision = await stored(js_log)
    assert (record.controller_id, record.term, revision) == ("ctl-b", 2, b.revision)
    assert b.held and b.term == 2
    # Nor does the next attempt overwrite the new holder.
    assert not await a.step()
    record, revision = await stored(js_log)
    assert (record.controller_id, record.term, revision) == ("ctl-b", 2, b.revision)


async def test_two_controllers_creating_the_lease_at_once_yield_one_holder(
    js_log: JetStreamLog, other_log: JetStreamLog
) -> None:
    racing = CompetingWrite(js_log)
    a, _ = lease(racing, "ctl-a")
    b, _ = lease(other_log, "ctl-b")
    # Both read an empty bucket; b creates the entry first.
    racing.race = b.step
    assert not await a.step()
    assert b.held and b.term == 1
    assert not a.held and a.term == 0 and a.last_error is not None
    record, _ = await stored(js_log)
    assert (record.controller_id, record.term) == ("ctl-b", 1)


async def test_release_lets_a_standby_take_over_at_once_with_the_next_term(
    js_log: JetStreamLog, other_log: JetStreamLog
) -> None:
    a, _ = lease(js_log, "ctl-a")
    b, _ = lease(other_log, "ctl-b")
    assert await a.step()
    assert not await b.step()
    await a.release()
    assert a.state == STANDBY and not a.held and a.remaining() == 0.0
    record, _ = await stored(js_log)
    assert (record.controller_id, record.term, record.released) == ("ctl-a", 1, True)
    # No clock advanced: a released record is free at once.
    assert await b.step()
    assert b.term == 2
    record, _ = await stored(js_log)
    assert (record.controller_id, record.term, record.released) == ("ctl-b", 2, False)


async def test_terms_strictly_increase_across_repeated_takeovers(
    js_log: JetStreamLog, other_log: JetStreamLog
) -> None:
    a, a_clock = lease(js_log, "ctl-a")
    b, b_clock = lease(other_log, "ctl-b")
    terms: list[int] = []
    holder, standby = (a, a_clock), (b, b_clock)
    assert await a.step()
    terms.append(a.term)
    for _ in range(4):
        (old, old_clock), (new, new_clock) = holder, standby
        assert not await new.step()  # starts watching the holder's revision
        new_clock.advance(TTL)
        old_clock.advance(TTL)
        assert await new.step()
        assert not await old.step()
        terms.append(new.term)
        holder, standby = standby, holder
    assert terms == [1, 2, 3, 4, 5]
    record, _ = await stored(js_log)
    assert record.term == 5
