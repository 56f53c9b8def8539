"""The grid's ingress: the one way a host's events reach the log.

Why hosts do not write into GRID_HOSTS themselves. A host may publish only its exact subjects,
and GRID_HOSTS keeps a bounded history per subject, so a flooding host could push out only its
own history; the readers drop it over its budget before any signature check
(grid.projections.budget). But the server stored every message of the flood, and a subject's
history holds its last 512 messages: a host flooding at its best rate replaced, within a second,
the heartbeats the live controller had admitted and planned with, so `gridctl replay` of that
window from the log folded other messages than the live controller had and reproduced 7 of 12
plans (issue 36). The log can only be the truth if what is stored is exactly what was within
budget.

So a host's account imports its subjects from GRID's ingress (`grid.ingress.<id>.<kind>`, which
no stream captures; grid.identity.accounts), and every controller relays: a message of a known
kind, carrying a signature, within its host's budget for that kind, is published unchanged
(payload and signature headers) on the host subject, and the stream's PubAck is passed back to
the host. Anything else is refused with an error answer,
counted by host and reason, and never stored. The budgets are per (host, kind), sized so that
the heartbeat subject's history still spans most of a minute at a flooder's best admitted rate
(HOST_SUBJECT_HISTORY / the heartbeat rate), and so that their sum stays inside the folds' own
per-host budget: the folds, a second line, never drop what an ingress admitted.

Every controller relays, not only the lease holder: a standby keeps hosts' heartbeats flowing
while a dead controller's lease runs out (a lease holder alone would leave hosts stale for the
whole takeover). The copies meet in the stream's duplicate window: the relayed message id is the
host's own, under its host token (a host cannot collide with another host's ids), so each event
is stored once. With no controller running, a host's append is answered "no responders" and the
agent tries again (grid.agent.service).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import msgspec
import structlog

from grid.events.authorship import SIG_HEADER, SIGNER_HEADER
from grid.events.subjects import HOST_EVENT_KINDS, INGRESS_ROOT, PREFIX
from grid.metrics import CounterSource
from grid.transport.jetstream import HOST_EVENT_MAX_BYTES
from grid.projections.budget import BudgetPolicy, Flagged, HostBudget, LogThrottle, merge_flagged

log = structlog.get_logger(__name__)

# Why the ingress refused a message (beside the budget's over_rate and over_bytes).
UNSIGNED = "unsigned"
UNKNOWN_KIND = "unknown_kind"
TOO_LARGE = "too_large"  # larger than any host event (the hosts stream would refuse it too)

KIB = 1 << 10
MIB = 1 << 20
# Per kind of host event: what an honest agent sends many times over. A heartbeat every 2 s by
# default (test fleets and impatient operators run 0.2-0.5 s) and one more on every change (a wave
# of loads is a few dozen); acks in bursts when a plan moves many models on one host; registrations
# at start; protection and qualification on transitions. The heartbeat rate bounds how fast a
# flooder replaces its own history: 512 heartbeats at 8/s is most of a minute of its best flood
# (17 minutes of an honest 2 s agent), so a replay from the log of the recent past folds what the
# live controller folded, and the latest heartbeat a plan used survives a flood of a minute. Sums
# (18.1 msg/s, 730 burst, 176 KiB/s, 5.5 MiB burst) stay inside the folds' per-host budget
# (grid.projections.budget: 20/s, 1000, 256 KiB/s, 8 MiB).
INGRESS_POLICIES: dict[str, BudgetPolicy] = {
    "heartbeat": BudgetPolicy(rate_per_second=8.0, burst_messages=100, bytes_per_second=64 * KIB,
                              burst_bytes=2 * MIB),
    "ack": BudgetPolicy(rate_per_second=8.0, burst_messages=500, bytes_per_second=64 * KIB, burst_bytes=2 * MIB),
    "registered": BudgetPolicy(rate_per_second=0.1, burst_messages=10, bytes_per_second=16 * KIB,
                               burst_bytes=MIB // 2),
    "protection": BudgetPolicy(rate_per_second=1.0, burst_messages=60, bytes_per_second=16 * KIB,
                               burst_bytes=MIB // 2),
    "qualification": BudgetPolicy(rate_per_second=1.0, burst_messages=60, bytes_per_second=16 * KIB,
                                  burst_bytes=MIB // 2),
}
assert set(INGRESS_POLICIES) == set(HOST_EVENT_KINDS), "every kind of host event has an ingress budget"

MSG_ID_HEADER = "Nats-Msg-Id"
# A host's message id longer than this is hashed (ids are the agent's event ids, ~30 characters).
MAX_MSG_ID = 128
# PubAcks the ingress waits for at most (each a few hundred bytes), and how long it keeps one
# once that many wait: the stream answers in milliseconds, so only a dead stream leaves them.
MAX_AWAITING = 65_536
ACK_WAIT_SECONDS = 30.0
# The error a refused append is answered with, in the stream's own PubAck shape, so the agent's
# append fails with the reason (grid.transport.jetstream.JetStreamLog.append_raw).
REFUSED_CODE = 429


def relayed_headers(token: str, kind: str, data: bytes, headers: dict[str, str]) -> dict[str, str]:
    """The headers a relayed message is stored with: the host's signature, and its message id
    under its host token (deterministic, so every controller's copy is the same event)."""
    own = headers.get(MSG_ID_HEADER)
    if not own or len(own) > MAX_MSG_ID:
        digest = hashlib.sha256(b"\0".join((kind.encode(), data, headers[SIG_HEADER].encode(), (own or "").encode())))
        own = digest.hexdigest()[:32]
    return {SIG_HEADER: headers[SIG_HEADER], SIGNER_HEADER: headers[SIGNER_HEADER], MSG_ID_HEADER: f"{token}:{own}"}


def refusal(reason: str) -> bytes:
    return msgspec.json.encode({"error": {"code": REFUSED_CODE, "err_code": REFUSED_CODE,
                                          "description": f"refused at the grid's ingress: {reason}"}})


class IngressBudget:
    """A token bucket per (host, kind), over this controller's own receipt times; and every
    refusal (budget or not) counted per host and reason."""

    def __init__(self, policies: dict[str, BudgetPolicy] | None = None) -> None:
        self._budgets = {kind: HostBudget(policy) for kind, policy in (policies or INGRESS_POLICIES).items()}
        # Refusals that are not a budget's verdict (unsigned, unknown kind), flagged alike.
        self._refusals = HostBudget()

    def admit(self, token: str, kind: str, size: int, at: float) -> str | None:
        budget = self._budgets.get(kind)
        if budget is None:
            self._refusals.flag(token, UNKNOWN_KIND, at)
            return UNKNOWN_KIND
        return budget.admit(f"{PREFIX}.host.{token}.{kind}", size, at, signed=True)

    def refuse(self, token: str, reason: str, at: float) -> None:
        self._refusals.flag(token, reason, at)

    @property
    def flagged(self) -> dict[str, Flagged]:
        """Every flagged host, its refusals summed over kinds."""
        return merge_flagged(*(b.flagged for b in (*self._budgets.values(), self._refusals)))


class HostIngress:
    """Relays hosts' appends from the ingress into GRID_HOSTS (see the module docstring)."""

    def __init__(self, budget: IngressBudget | None = None, *, clock: Callable[[], float] = time.time) -> None:
        self.budget = budget or IngressBudget()
        self._clock = clock
        self._nc: Any = None
        self._subs: list[Any] = []
        self._throttle = LogThrottle()
        # Appends stored and not yet acknowledged by the stream: our reply token -> (the host's
        # reply subject, when we sent it). The server lets no client publish with a reply subject
        # it made up for an import (`_R_.…`), so the stream answers us and we pass the PubAck on.
        self._awaiting: dict[str, tuple[str, float]] = {}
        self._next = 0
        self._reply_root = ""
        self.relayed = 0
        self.refused: dict[str, int] = {}

    async def start(self, nc: Any) -> None:
        self._nc = nc
        self._reply_root = nc.new_inbox()
        self._subs = [await nc.subscribe(f"{self._reply_root}.*", cb=self._on_pub_ack),
                      # One subscription, one callback at a time: a host's events are stored in the
                      # order it sent them (the folds refuse a heartbeat older than the last one).
                      await nc.subscribe(f"{INGRESS_ROOT}.*.*", cb=self._on_message)]
        await nc.flush()  # the server knows of us before start returns: no append finds no one

    async def stop(self) -> None:
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception:  # the connection is gone already
                pass
        self._subs = []

    async def _on_message(self, msg: Any) -> None:
        parts = msg.subject.split(".")
        token, kind = parts[2], parts[3]
        at = self._clock()
        headers = msg.headers or {}
        reason: str | None = None
        if len(msg.data) > HOST_EVENT_MAX_BYTES:
            reason = TOO_LARGE
        elif SIG_HEADER not in headers or SIGNER_HEADER not in headers:
            reason = UNSIGNED
        if reason is not None:
            self.budget.refuse(token, reason, at)
        else:
            reason = self.budget.admit(token, kind, len(msg.data), at)
        if reason is None:
            self.relayed += 1
            await self._nc.publish(f"{PREFIX}.host.{token}.{kind}", msg.data, reply=self._await_ack(msg.reply, at),
                                   headers=relayed_headers(token, kind, msg.data, headers))
            return
        self.refused[reason] = self.refused.get(reason, 0) + 1
        if msg.reply:
            await self._nc.publish(msg.reply, refusal(reason))
        allowed, suppressed = self._throttle.allow((token, reason), at)
        if allowed:
            log.warning("ingress.refused", host=token, kind=kind, reason=reason, suppressed=suppressed)

    def _await_ack(self, host_reply: str, at: float) -> str:
        """The reply subject to store an append with: ours, remembered, when the host awaits one."""
        if not host_reply:
            return ""
        if len(self._awaiting) >= MAX_AWAITING:
            cutoff = at - ACK_WAIT_SECONDS
            for token in [t for t, (_, sent) in self._awaiting.items() if sent < cutoff]:
                del self._awaiting[token]
            if len(self._awaiting) >= MAX_AWAITING:
                return ""  # stored all the same; this host's append times out and is tried again
        self._next += 1
        token = str(self._next)
        self._awaiting[token] = (host_reply, at)
        return f"{self._reply_root}.{token}"

    async def _on_pub_ack(self, msg: Any) -> None:
        entry = self._awaiting.pop(msg.subject.rsplit(".", 1)[-1], None)
        if entry is not None:
            await self._nc.publish(entry[0], msg.data, headers=msg.headers)


def ingress_metrics(read: Callable[[], HostIngress | None]) -> list[CounterSource]:
    """`grid_ingress_refused_total{host,reason}` and `grid_ingress_relayed_total` of the ingress
    `read()` returns (none while a controller runs without one)."""

    def refused() -> list[tuple[tuple[str, ...], float]]:
        ingress = read()
        if ingress is None:
            return []
        return [((f.host, reason), float(n)) for f in sorted(ingress.budget.flagged.values(), key=lambda f: f.host)
                for reason, n in sorted(f.dropped.items())]

    def relayed() -> list[tuple[tuple[str, ...], float]]:
        ingress = read()
        return [] if ingress is None else [((), float(ingress.relayed))]

    return [
        CounterSource("grid_ingress_refused",
                      "Host events the grid's ingress refused and never stored, by host and reason (over_rate, "
                      "over_bytes: over the host's budget for that kind of event; unsigned; too_large; unknown_kind).",
                      ("host", "reason"), refused),
        CounterSource("grid_ingress_relayed", "Host events this controller's ingress stored in the hosts stream.",
                      (), relayed),
    ]
