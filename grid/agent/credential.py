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
import structlog

from grid.agent.identity import HostIdError
from grid.events.authorship import SIG_HEADER, SIGNER_HEADER
from grid.events.lease import LEASE_KEY, LeaseRecord, lease_subject, unsigned_bytes
from grid.events.log import EventLog
from grid.events.subjects import LEASE_BUCKET, escape_token
from grid.identity.creds import credential_principal
from grid.identity.enrolment import Refused, renew, renewal_due
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
                if isinstance(outcome, Refused):
                    log.warning("agent.renewal_refused", reason=outcome.reason)
                else:
                    log.info("agent.credential_renewed", expires_at=outcome)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # retried at the next check; expiry is hours away when due
            log.warning("agent.renewal_failed", error=str(exc))
        await asyncio.sleep(interval)


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
