"""Follow a fleet from its log: residency transitions and command outcomes, as lines.

`lines_for` is the pure part (previous residency states, one event -> new states and the lines it
produces); `follow` subscribes to the hosts and commands streams as the operator identity.
Heartbeats repeat the whole residency table every interval, so only changes become lines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from grid.events import codec
from grid.events.acks import ActionAck
from grid.events.authorship import AuthorshipGate
from grid.events.commands import CommandIssued, CommandWithdrawn
from grid.events.host import HostHeartbeat
from grid.events.log import StoredMessage
from grid.events.subjects import COMMANDS_STREAM, HOSTS_STREAM
from grid.identity.provenance import vouched_for
from grid.tasks import cancel_and_wait

# Residency state of a model on a host; "absent" when a heartbeat no longer lists it.
ABSENT = "absent"

States = dict[tuple[str, str], str]


@dataclass(frozen=True)
class Line:
    at: float
    kind: str  # residency | command | outcome | withdrawn
    host_id: str
    text: str
    model_id: str = ""
    # A residency line's states; a command line's kind and reason in `after`/`text`.
    before: str = ""
    after: str = ""


def lines_for(states: States, event: object, at: float) -> tuple[States, list[Line]]:
    """The residency states after `event` and the lines worth showing for it."""
    if isinstance(event, HostHeartbeat):
        host = event.host_id
        now = {(host, r.model_id): r.state for r in event.residencies}
        lines = []
        for key, state in sorted(now.items()):
            before = states.get(key, ABSENT)
            if before != state:
                lines.append(Line(at, "residency", host, f"{host} {key[1]}: {before} -> {state}", key[1], before, state))
        for key, before in sorted(states.items()):
            if key[0] == host and key not in now and before != ABSENT:
                lines.append(Line(at, "residency", host, f"{host} {key[1]}: {before} -> {ABSENT}", key[1], before,
                                  ABSENT))
        merged = {k: v for k, v in states.items() if k[0] != host}
        merged.update(now)
        return merged, lines
    if isinstance(event, CommandIssued):
        reason = f" ({event.reason})" if event.reason else ""
        return states, [Line(at, "command", event.host_id,
                             f"command {event.kind} {event.model_id} -> {event.host_id}{reason}", event.model_id,
                             after=event.kind)]
    if isinstance(event, ActionAck):
        took = f" in {event.duration_seconds:.1f}s" if event.duration_seconds is not None else ""
        what = f"{event.kind} {event.model_id}".strip() or event.action_id
        message = f": {event.message}" if event.message else ""
        return states, [Line(at, "outcome", event.host_id, f"{event.host_id} {what} {event.status}{took}{message}")]
    if isinstance(event, CommandWithdrawn):
        return states, [Line(at, "withdrawn", event.host_id,
                             f"withdrawn {event.action_id} on {event.host_id} ({event.reason})")]
    return states, []


WATCHED_STREAMS = (HOSTS_STREAM, COMMANDS_STREAM)


async def follow(nats_url: str, control_home: Path, emit: Callable[[Line], None], *,
                 stop: Callable[[], bool] = lambda: False) -> None:
    """Print lines for new events until cancelled (or `stop()` turns true between events)."""
    import asyncio

    from grid.identity.connect import connect_log
    from grid.identity.local import local_credential, local_tls_ca

    creds = local_credential(control_home, "operator")
    log = await connect_log(nats_url, credentials=creds, tls_ca=local_tls_ca(control_home),
                            name="gridctl-test-watch", ensure_streams=False)
    states: States = {}
    queue: asyncio.Queue[StoredMessage] = asyncio.Queue()
    # What the watcher shows is only what provably came from who may write it.
    gate = AuthorshipGate(log.authorship)

    async def pump(stream: str) -> None:
        # From now on: the first heartbeat of each host shows where it stands (absent -> state).
        sub = await log.subscribe(stream)
        async for msg in sub:
            await queue.put(msg)

    pumps = [asyncio.create_task(pump(s)) for s in WATCHED_STREAMS]
    try:
        while not stop():
            try:
                msg = await asyncio.wait_for(queue.get(), timeout=0.5)
            except asyncio.TimeoutError:
                continue
            # A malformed or unproven event is the controller's to report, not the watcher's.
            if not gate.check(msg.stream, msg.seq, msg.subject, msg.data, msg.headers, msg.time).ok:
                continue
            try:
                event = codec.decode(msg.data)
            except codec.EventDecodeError:
                continue
            if not vouched_for(msg, event):
                continue
            states, lines = lines_for(states, event, msg.time)
            for line in lines:
                emit(line)
    finally:
        await cancel_and_wait(pumps)
        await log.close()
