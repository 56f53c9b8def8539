"""The agent's NATS credential: the command consumer it names, its renewal, and the lease check.

With auth on, the agent's identity is a host credential (grid.identity): the controller made
the host's durable command consumer under the unguessable name the credential carries, the
credential expires and is renewed over the enrolment service, and every command is checked
against the controller the lease names before the fence moves.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import msgspec
import nats
import structlog

from grid.agent.identity import HostIdError
from grid.events.authorship import SIG_HEADER, SIGNER_HEADER
from grid.events.lease import LEASE_KEY, LeaseRecord, lease_subject, unsigned_bytes
from grid.events.log import EventLog
from grid.events.subjects import LEASE_BUCKET, escape_token
from grid.identity.creds import connect_options, creds_claims, credential_principal
from grid.identity.invitations import split_servers
from grid.identity.enrolment import EnrolmentRefused, renew, renewal_due
from grid.identity.permissions import Role

log = structlog.get_logger("grid.agent")

# How often the agent asks itself whether its credential is due for renewal (it is due at two
# thirds of its lifetime, hours ahead of expiry with the default TTL).
RENEWAL_CHECK_SECONDS = 60.0


def command_consumer(credentials: Path | None, host_id: str) -> str:
    """The durable consumer the agent reads its commands through.

    Without a credential (a server without auth): `agent-<id>`, created by the agent itself.
    With one: the name the controller provisioned, from the credential, which must speak for
    this very host."""
    if credentials is None:
        return f"agent-{escape_token(host_id)}"
    principal = credential_principal(Path(credentials))
    if principal is None or principal.role is not Role.HOST or principal.command_consumer is None:
        raise HostIdError(f"{credentials} is not a host credential")
    if principal.host_id != host_id:
        raise HostIdError(f"{credentials} speaks for host {principal.host_id!r}, not {host_id!r}")
    return principal.command_consumer


async def renewal_loop(nc: Any, credentials: Path, *, interval: float = RENEWAL_CHECK_SECONDS) -> None:
    """Renew the credential in place when due (the client reads the file on reconnect)."""
    while True:
        try:
            if renewal_due(credentials, time.time()):
                outcome = await renew(nc, credentials)
                if isinstance(outcome, EnrolmentRefused):
                    log.warning("agent.renewal_refused", reason=outcome.reason)
                else:
                    log.info("agent.credential_renewed", expires_at=outcome)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # retried at the next check; expiry is hours away when due
            log.warning("agent.renewal_failed", error=str(exc))
        await asyncio.sleep(interval)


# How often an agent whose connection is down asks the servers whether they still take its
# credential (one short connection attempt each time, only while disconnected).
REVOCATION_PROBE_SECONDS = 1.0
REVOCATION_PROBE_TIMEOUT_SECONDS = 3.0
# Consecutive refusals that make a revocation: one server of a cluster that has not caught up
# with the account (or a refusal racing a restart) must not stop a healthy host.
REVOCATION_REFUSALS = 3


def revoked_message(at: float) -> str:
    """What a revoked agent says before it stops."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
    return (f"this host's credential was revoked by the operator at {when}; ask for a new invitation "
            "(`gridctl invite` where the grid is run, then `gridctl node join TOKEN` here)")


def credential_expired(credentials: Path, now: float) -> bool:
    claims = creds_claims(Path(credentials))
    return "exp" in claims and float(claims["exp"]) <= now


async def credential_refused(url: str, credentials: Path, tls_ca: Path | None, *,
                             timeout: float = REVOCATION_PROBE_TIMEOUT_SECONDS) -> bool | None:
    """Whether the grid's servers refuse `credentials`: True when one answered with an
    authorization violation, False when one took it, None when none answered (an outage)."""
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    try:
        nc = await nats.connect(servers=list(split_servers(url)), name="grid-agent-probe", allow_reconnect=False,
                                max_reconnect_attempts=0, connect_timeout=timeout, error_cb=on_error,
                                **connect_options(Path(credentials), tls_ca))
    except Exception as exc:  # noqa: BLE001 - nats-py raises several unrelated types for "refused"
        errors.append(str(exc))
        return True if any("authorization violation" in e.lower() for e in errors) else None
    await nc.close()
    return False


async def watch_revocation(event_log: Any, url: str, credentials: Path, tls_ca: Path | None, *,
                           clock: Any = time.time, probe_seconds: float = REVOCATION_PROBE_SECONDS) -> float:
    """Returns when the servers stopped taking this host's credential although it has not
    expired: the operator revoked it (`gridctl node revoke` pushes the revocation to the servers,
    which drop the connection at once and refuse every reconnect; retrying would go on forever).

    Watches `event_log`'s connection (a JetStreamLog): while it is down, probes the servers with
    the credential; a connection that comes back, or servers that do not answer, are not a
    revocation. The time returned is when the connection was lost."""
    lost = asyncio.Event()
    lost_at: list[float] = []

    def on_disconnect() -> None:
        if not lost_at:
            lost_at.append(clock())
        lost.set()

    event_log.add_disconnect_listener(on_disconnect)
    try:
        while True:
            await lost.wait()
            client = event_log.client
            # Down, or closed by the client itself after the server's refusal: probe until the
            # connection is back (the caller cancels this when it closes the log on purpose).
            refusals = 0
            while not client.is_connected:
                refused = not credential_expired(credentials, clock()) and await credential_refused(
                    url, credentials, tls_ca)
                refusals = refusals + 1 if refused else 0
                if refusals >= REVOCATION_REFUSALS:
                    return lost_at[0] if lost_at else clock()
                await asyncio.sleep(probe_seconds)
            lost.clear()
            lost_at.clear()
    finally:
        event_log.remove_disconnect_listener(on_disconnect)


class LeaseHolder(msgspec.Struct, frozen=True):
    controller_id: str
    term: int
    # The public key that signed the lease record ("" on a grid without identities).
    signer: str = ""


async def lease_holder(event_log: EventLog) -> LeaseHolder | None:
    """Who the lease names now (None: no lease, unreadable, or, on a log with identities, not
    signed by a controller of this grid: each refuses every command)."""
    try:
        entry = await event_log.kv_get(LEASE_BUCKET, LEASE_KEY)
        if entry is None or not entry.value:
            return None
        record = msgspec.json.decode(entry.value, type=LeaseRecord)
    except Exception as exc:
        log.warning("agent.lease_unreadable", error=str(exc))
        return None
    authorship = getattr(event_log, "authorship", None)
    if authorship is None:
        return LeaseHolder(controller_id=record.controller_id, term=record.term)
    verdict = authorship.verify(lease_subject(LEASE_KEY), unsigned_bytes(record),
                                {SIGNER_HEADER: record.signer, SIG_HEADER: record.signature}, at=time.time())
    if not verdict.ok or verdict.role != Role.CONTROLLER.value:
        log.warning("agent.lease_unproven", reason=verdict.reason or f"signed by a {verdict.role}")
        return None
    return LeaseHolder(controller_id=record.controller_id, term=record.term, signer=verdict.signer)
