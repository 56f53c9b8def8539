"""Per-host budgets on the hosts stream: a host over its rate or byte budget is dropped cheaply.

A legitimately enrolled host can publish on its own subjects as fast as its connection allows
(thousands of valid, signed heartbeats a second, or unsigned junk). Every reader that folds
GRID_HOSTS (controller, gateway, replay) reads one ordered consumer, so each message the fold
spends time on delays every message behind it: at ~1 ms a message (signature, decode, fold) a
flood of 5.4k msg/s for 30 s queued 160 s of work ahead of the honest hosts' heartbeats, which
aged past the heartbeat timeout, and every model answered 503 (issue 36). The cure is to make the
flooder's messages cost almost nothing: before a message is decoded or its signature checked, a
token bucket keyed by the host token of its subject (plus whether it carries a signature at all)
decides whether it is within that host's budget. Over budget it is dropped (its position is
still advanced), counted by reason, and the host is flagged; within budget it goes on to the
authorship gate and the fold as before.

Since hosts append through the grid's ingress (grid.controller.ingress), which stores only what
is within a per-kind budget that sums inside this one, a host's flood no longer reaches the
stream: these buckets are the second line, for whatever lands on a host subject another way
(a GRID client that may publish there, a host credential from before hosts had accounts).

Determinism: a bucket is a pure function of the receipt times (JetStream timestamps, the
server's clock) and sizes of the messages before it on its key, in stream order; nothing reads
a wall clock. A replay of the same messages drops exactly the same ones, and the state travels
in the runner's snapshot so a restarted fold continues where it stood.

Keys: `<host token>` for messages carrying a signature header, `<host token>/u` for those that do
not. Reflections (a JetStream API reply the server itself stores on a subject the requester
chose) carry no signature header, so they can never spend an honest host's signed budget; and a
host cannot put a signature header on another host's subject, since it may publish only its own.

Sizing: an honest agent heartbeats every 2 s (and once more on every change), and acknowledges
each command with a few acks; a plan that moves many models on one host acks in a burst. The
burst (`HOST_BURST_MESSAGES`) covers such a wave many times over; the sustained rate
(`HOST_RATE_PER_SECOND`) is 40 times the heartbeat rate. Bytes: a heartbeat is bounded by the
host's JWT payload limit (grid.identity.permissions.HOST_MAX_PAYLOAD).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from grid.metrics import CounterSource

# Reasons a message is dropped over budget (counted beside the authorship rejections).
OVER_RATE = "over_rate"
OVER_BYTES = "over_bytes"
BUDGET_REASONS: tuple[str, ...] = (OVER_RATE, OVER_BYTES)

HOST_RATE_PER_SECOND = 20.0
HOST_BURST_MESSAGES = 1000.0
HOST_BYTES_PER_SECOND = 256.0 * 1024
HOST_BURST_BYTES = 8.0 * 1024 * 1024
# Hosts kept flagged (the most recent droppers); their drop counts are complete in `dropped`.
FLAGGED_KEPT = 256
# Every this many admissions, buckets that have refilled completely are forgotten (a full bucket
# is the same as no bucket): the map holds only hosts that spent budget recently.
PRUNE_EVERY = 4096

UNSIGNED_SUFFIX = "/u"


class BudgetPolicy(msgspec.Struct, frozen=True, kw_only=True):
    rate_per_second: float = HOST_RATE_PER_SECOND
    burst_messages: float = HOST_BURST_MESSAGES
    bytes_per_second: float = HOST_BYTES_PER_SECOND
    burst_bytes: float = HOST_BURST_BYTES

    def __post_init__(self) -> None:
        if min(self.rate_per_second, self.burst_messages, self.bytes_per_second, self.burst_bytes) <= 0:
            raise ValueError("budget rates and bursts must be positive")
        if self.burst_messages < 1:
            raise ValueError("a burst of at least one message is needed")


class Flagged(msgspec.Struct, kw_only=True):
    """A host that went over its budget: drops by reason, and the receipt time of the last."""

    host: str
    dropped: dict[str, int] = {}
    first_at: float = 0.0
    last_at: float = 0.0


class BudgetState(msgspec.Struct, kw_only=True):
    """What a budget carries across a snapshot (everything its verdicts depend on)."""

    # key -> [message tokens, byte tokens, receipt time of the last update]
    buckets: dict[str, list[float]] = {}
    dropped: dict[str, int] = {}
    flagged: dict[str, Flagged] = {}
    admitted: int = 0


def host_token(subject: str) -> str | None:
    """The (escaped) host token of a `grid.host.<token>.<kind>` subject, without decoding it."""
    parts = subject.split(".", 3)
    if len(parts) < 3 or parts[0] != "grid" or parts[1] != "host":
        return None
    return parts[2]


class HostBudget:
    """Token buckets per host token over receipt times: `admit` says whether a message is within
    budget (None) or why it is dropped (OVER_RATE, OVER_BYTES)."""

    def __init__(self, policy: BudgetPolicy | None = None, state: BudgetState | None = None) -> None:
        self.policy = policy or BudgetPolicy()
        self.state = state or BudgetState()

    @property
    def dropped(self) -> dict[str, int]:
        return self.state.dropped

    @property
    def flagged(self) -> dict[str, Flagged]:
        return self.state.flagged

    def admit(self, subject: str, size: int, at: float, *, signed: bool) -> str | None:
        token = host_token(subject)
        if token is None:
            token = "?"
        key = token if signed else token + UNSIGNED_SUFFIX
        p = self.policy
        buckets = self.state.buckets
        bucket = buckets.get(key)
        if bucket is None:
            tokens, byte_tokens = p.burst_messages, p.burst_bytes
        else:
            tokens, byte_tokens, last = bucket
            elapsed = at - last
            if elapsed > 0:  # a receipt time that went back refills nothing
                tokens = min(p.burst_messages, tokens + elapsed * p.rate_per_second)
                byte_tokens = min(p.burst_bytes, byte_tokens + elapsed * p.bytes_per_second)
            else:
                at = last
        if tokens < 1.0:
            reason: str | None = OVER_RATE
        elif byte_tokens < size:  # (a message larger than the whole burst is never affordable)
            reason = OVER_BYTES
        else:
            reason = None
            tokens -= 1.0
            byte_tokens -= size
        if bucket is None:
            buckets[key] = [tokens, byte_tokens, at]
        else:
            bucket[0], bucket[1], bucket[2] = tokens, byte_tokens, at
        if reason is not None:
            self.flag(token, reason, at)
            return reason
        self.state.admitted += 1
        if self.state.admitted % PRUNE_EVERY == 0:
            self._prune(at)
        return None

    def flag(self, token: str, reason: str, at: float) -> None:
        """Count a message of `token` dropped for `reason` at receipt time `at`, and flag its host."""
        dropped = self.state.dropped
        dropped[reason] = dropped.get(reason, 0) + 1
        flagged = self.state.flagged
        entry = flagged.get(token)
        if entry is None:
            entry = flagged[token] = Flagged(host=_display(token), dropped={}, first_at=at, last_at=at)
            if len(flagged) > FLAGGED_KEPT:
                oldest = min(flagged.values(), key=lambda f: (f.last_at, f.host))
                flagged.pop(next(k for k, v in flagged.items() if v is oldest))
        entry.dropped[reason] = entry.dropped.get(reason, 0) + 1
        entry.last_at = max(entry.last_at, at)

    def _prune(self, now: float) -> None:
        p = self.policy
        full_after = max(p.burst_messages / p.rate_per_second, p.burst_bytes / p.bytes_per_second)
        stale = [k for k, (_, _, last) in self.state.buckets.items() if now - last >= full_after]
        for k in stale:
            del self.state.buckets[k]

    def over_since(self, since: float) -> list[Flagged]:
        """Hosts that had a message dropped at or after `since` (receipt time), by host."""
        return sorted((f for f in self.state.flagged.values() if f.last_at >= since), key=lambda f: f.host)


def _display(token: str) -> str:
    from grid.events.subjects import SubjectError, unescape_token

    try:
        return unescape_token(token)
    except (SubjectError, UnicodeDecodeError):
        return token


class LogThrottle:
    """At most one log line per key every `interval` seconds (of receipt time), with the number of
    lines suppressed since the last one: a flood of rejections writes a handful of lines, not
    one per message (31 MB of warnings per process in issue 36)."""

    def __init__(self, interval: float = 10.0, max_keys: int = 4096) -> None:
        self.interval = interval
        self.max_keys = max_keys
        # key -> [time of the last line, lines suppressed since]
        self._seen: dict[tuple[str, ...], list[float]] = {}
        self.suppressed_total = 0

    def allow(self, key: tuple[str, ...], at: float) -> tuple[bool, int]:
        """(log now?, lines suppressed since the last one for this key)."""
        entry = self._seen.get(key)
        if entry is not None and 0 <= at - entry[0] < self.interval:
            entry[1] += 1
            self.suppressed_total += 1
            return False, 0
        suppressed = int(entry[1]) if entry is not None else 0
        if entry is None and len(self._seen) >= self.max_keys:
            cutoff = at - self.interval
            for k in [k for k, v in self._seen.items() if v[0] < cutoff] or list(self._seen)[: self.max_keys // 2]:
                del self._seen[k]
        self._seen[key] = [at, 0]
        return True, suppressed


# Status lists a flagged host as over its budget now while its last drop is this recent.
OVER_BUDGET_RECENT_SECONDS = 60.0


def merge_flagged(*maps: Mapping[str, Flagged]) -> dict[str, Flagged]:
    """Flagged hosts of several budgets as one map: drops summed by reason, the widest span."""
    merged: dict[str, Flagged] = {}
    for flagged in maps:
        for token, f in flagged.items():
            entry = merged.get(token)
            if entry is None:
                merged[token] = Flagged(host=f.host, dropped=dict(f.dropped), first_at=f.first_at, last_at=f.last_at)
                continue
            for reason, n in f.dropped.items():
                entry.dropped[reason] = entry.dropped.get(reason, 0) + n
            entry.first_at = min(entry.first_at, f.first_at)
            entry.last_at = max(entry.last_at, f.last_at)
    return merged


def flagged_rows(flagged: Mapping[str, Flagged] | None, now: float) -> list[dict[str, object]]:
    """Status rows of the hosts that went over their budget (most messages dropped first)."""
    if not flagged:
        return []
    rows = [{"host": f.host, "dropped": dict(sorted(f.dropped.items())), "total": sum(f.dropped.values()),
             "first_at": f.first_at, "last_at": f.last_at,
             "over_now": now - f.last_at < OVER_BUDGET_RECENT_SECONDS}
            for f in flagged.values()]
    return sorted(rows, key=lambda r: (-int(r["total"]), str(r["host"])))  # type: ignore[call-overload]


def over_budget_warnings(rows: list[dict[str, object]]) -> list[str]:
    return [f"host {r['host']} over its log budget: {r['total']} messages dropped unread "
            f"({', '.join(f'{k}={v}' for k, v in r['dropped'].items())})"  # type: ignore[attr-defined]
            for r in rows if r["over_now"]]


def budget_metric(read: Callable[[], "HostBudget | None"]) -> "CounterSource":
    """`grid_host_budget_dropped_total{host,reason}`: hosts-stream messages this process dropped
    unread because their host was over its budget (flagged hosts only, so labels stay bounded)."""
    from grid.metrics import CounterSource

    def samples() -> list[tuple[tuple[str, ...], float]]:
        budget = read()
        if budget is None:
            return []
        return [((f.host, reason), float(n)) for f in sorted(budget.flagged.values(), key=lambda f: f.host)
                for reason, n in sorted(f.dropped.items())]

    return CounterSource("grid_host_budget_dropped",
                         "Hosts-stream messages dropped before any signature check because their host was over "
                         "its rate or byte budget, by host and reason (over_rate, over_bytes).",
                         ("host", "reason"), samples)
