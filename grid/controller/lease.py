"""Single-writer lease in the JetStream KV bucket ``grid_lease`` (CAS on the entry revision).

The holder renews every few seconds; every takeover increments the term, and agents refuse
lower terms forever (a fencing token, Kleppmann). Expiry is judged on each process's own
monotonic clock, never by comparing wall clocks across machines:

* the holder's authority ends ``ttl`` after it *sent* its last successful write, minus a margin;
* a standby takes over only after it has watched the same revision for ``ttl`` on its own clock,
  so it necessarily waits at least as long as the holder's authority lasts.

A clean stop writes a released record so a standby takes over at once. A restarted controller
with the same persistent id may reclaim its own lease immediately (new term) only when the
caller proves the previous incarnation is dead (the grid-home lock it held was free).
"""

from __future__ import annotations

import msgspec
import structlog

from grid.clock import Clock, SystemClock
from grid.events.lease import LEASE_KEY, LeaseRecord, encode_record, lease_decoder
from grid.events.log import ConflictError, EventLog, LogError
from grid.events.subjects import LEASE_BUCKET

log = structlog.get_logger(__name__)

# Lease states shown in status.
HELD = "held"
STANDBY = "standby"
LOST = "lost"


class Lease:
    def __init__(
        self,
        log_: EventLog,
        controller_id: str,
        *,
        ttl_seconds: float = 15.0,
        margin_seconds: float = 1.0,
        clock: Clock | None = None,
        reclaim_own: bool = False,
        key: str = LEASE_KEY,
    ) -> None:
        self._log = log_
        self.controller_id = controller_id
        self.ttl = ttl_seconds
        self.margin = margin_seconds
        self._clock = clock or SystemClock()
        self._reclaim_own = reclaim_own
        self.key = key
        self.term = 0
        self.revision = 0
        self._valid_until = 0.0  # monotonic
        self._seen_revision = -1
        self._seen_at = 0.0
        # Highest term seen anywhere (lease record, plans, commands): a takeover exceeds it.
        self.min_term = 0
        self.holder_id: str | None = None
        self.holder_term = 0
        self.state = STANDBY
        self.takeovers = 0
        self.last_error: str | None = None

    # --- local view ---------------------------------------------------------------------------

    def remaining(self) -> float:
        """Seconds of authority left on the local monotonic clock (0 when not the holder)."""
        if self.state != HELD:
            return 0.0
        return max(0.0, self._valid_until - self._clock.monotonic())

    @property
    def held(self) -> bool:
        return self.state == HELD and self.remaining() > self.margin

    def expires_at(self) -> float:
        return self._clock.now() + self.remaining()

    def observe_term(self, term: int) -> None:
        self.min_term = max(self.min_term, term)

    def describe(self) -> dict[str, object]:
        return {
            "state": self.state,
            "controller_id": self.controller_id,
            "term": self.term,
            "holder_id": self.holder_id,
            "holder_term": self.holder_term,
            "revision": self.revision,
            "ttl_seconds": self.ttl,
            "remaining_seconds": round(self.remaining(), 3),
            "takeovers": self.takeovers,
            "last_error": self.last_error,
        }

    # --- protocol -------------------------------------------------------------------------------

    def _record(self, term: int, *, released: bool = False) -> bytes:
        now = self._clock.now()
        record = LeaseRecord(
            controller_id=self.controller_id, term=term, ttl_seconds=self.ttl,
            renewed_at=now, expires_at=0.0 if released else now + self.ttl, released=released,
        )
        return encode_record(record, getattr(self._log, "authorship", None), self.key)

    def _lose(self, why: str) -> None:
        if self.state == HELD:
            log.warning("controller lease lost", term=self.term, reason=why)
            self.state = LOST
        self.last_error = why
        self._valid_until = 0.0

    async def _write(self, term: int, expected_revision: int) -> bool:
        started = self._clock.monotonic()
        try:
            rev = await self._log.kv_put(LEASE_BUCKET, self.key, self._record(term), expected_revision=expected_revision)
        except ConflictError as exc:
            self._lose(f"lease write raced: {exc}")
            return False
        took_over = term != self.term or self.state != HELD
        self.term = term
        self.revision = rev
        self._valid_until = started + self.ttl
        self.state = HELD
        self.holder_id, self.holder_term = self.controller_id, term
        self.min_term = max(self.min_term, term)
        if took_over:
            self.takeovers += 1
            log.info("controller lease acquired", term=term, controller_id=self.controller_id)
        return True

    async def step(self) -> bool:
        """One acquire-or-renew attempt. Returns whether this controller holds the lease."""
        try:
            entry = await self._log.kv_get(LEASE_BUCKET, self.key)
        except LogError as exc:
            self.last_error = str(exc)
            if self.state == HELD and self.remaining() <= self.margin:
                self._lose("lease unreadable and authority expired")
            return self.held
        if entry is None:
            return await self._write(self.min_term + 1, 0)
        try:
            rec: LeaseRecord | None = lease_decoder.decode(entry.value)
        except (msgspec.DecodeError, msgspec.ValidationError):
            rec = None
        if rec is not None:
            self.holder_id, self.holder_term = rec.controller_id, rec.term
            self.min_term = max(self.min_term, rec.term)
        mine = rec is not None and rec.controller_id == self.controller_id
        if mine and self.state == HELD and entry.revision == self.revision:
            return await self._write(self.term, entry.revision)  # renewal, same term
        if self.state == HELD:
            self._lose(f"lease revision moved to {entry.revision} (holder {rec.controller_id if rec else '?'})")
        now_mono = self._clock.monotonic()
        if entry.revision != self._seen_revision:
            self._seen_revision = entry.revision
            self._seen_at = now_mono
        lapsed = now_mono - self._seen_at >= (rec.ttl_seconds if rec is not None else self.ttl)
        reclaim, self._reclaim_own = mine and self._reclaim_own, False
        if (rec is not None and rec.released) or reclaim or lapsed:
            return await self._write(self.min_term + 1, entry.revision)
        if self.state != LOST:
            self.state = STANDBY
        return False

    async def verify(self) -> bool:
        """Re-read the KV entry: still ours, same revision, and authority left locally."""
        if not self.held:
            return False
        try:
            entry = await self._log.kv_get(LEASE_BUCKET, self.key)
        except LogError as exc:
            self.last_error = str(exc)
            return self.held  # unreadable: local authority still bounds the risk
        if entry is None or entry.revision != self.revision:
            self._lose("lease taken over")
            return False
        return self.held

    async def release(self) -> None:
        if self.state != HELD:
            return
        for _attempt in range(2):
            try:
                await self._log.kv_put(LEASE_BUCKET, self.key, self._record(self.term, released=True),
                                       expected_revision=self.revision)
                break
            except ConflictError:
                # A renewal may have landed whose reply we never saw (cancelled mid-request):
                # release only if the entry is still our own record in our term.
                entry = await self._log.kv_get(LEASE_BUCKET, self.key)
                try:
                    rec = lease_decoder.decode(entry.value) if entry is not None else None
                except (msgspec.DecodeError, msgspec.ValidationError):
                    rec = None
                if entry is None or rec is None or rec.controller_id != self.controller_id or rec.term != self.term:
                    break
                self.revision = entry.revision
            except LogError as exc:
                log.warning("lease release failed", error=str(exc))
                break
        self.state = STANDBY
        self._valid_until = 0.0
