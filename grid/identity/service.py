"""What the controller runs for identity: host command consumers and the enrolment service.

A host may not create its own command consumer (permissions.py says why), so the controller
makes one for every admitted, unrevoked host when it starts and for each host it admits while
running; and it answers join/renew requests (enrolment.py) on its own connection.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from grid.events.log import EventLog
from grid.identity.authority import Authority
from grid.identity.enrolment import EnrolmentService
from grid.identity.invitations import InvitationStore
from grid.identity.permissions import Principal
from grid.identity.provision import provision_host_consumer

log = structlog.get_logger(__name__)

INVITATIONS_FILE = "invitations.json"


def invitation_store(authority: Authority) -> InvitationStore:
    """The one invitation store of a grid: beside the authority (gridctl invite writes it)."""
    return InvitationStore(authority.directory / INVITATIONS_FILE)


class ControllerIdentity:
    def __init__(self, authority_dir: Path, *, ca_pem: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.authority = Authority(authority_dir)
        self.enrolment = EnrolmentService(self.authority, invitation_store(self.authority), clock=clock,
                                          ca_pem=ca_pem, on_admitted=self._provision)
        self._log: EventLog | None = None

    async def _provision(self, host: Principal) -> None:
        assert self._log is not None
        await provision_host_consumer(self._log, host)

    async def start(self, event_log: EventLog, nc: Any) -> None:
        """Provision every admitted host's consumer, then serve enrolment on `nc` (the
        controller's own NATS connection)."""
        self._log = event_log
        authorship = getattr(event_log, "authorship", None)
        if authorship is not None:
            self.enrolment.sign = authorship.sign
        self.authority.reload()
        for host_id in sorted(self.authority.registry.hosts):
            if self.authority.host_revoked(host_id):
                continue
            try:
                await self._provision(self.authority.host_principal(host_id))
            except Exception as exc:  # one bad record must not keep the controller down
                log.warning("identity.provision_failed", host_id=host_id, error=str(exc))
        await self.enrolment.serve(nc)

    async def stop(self) -> None:
        await self.enrolment.stop()
