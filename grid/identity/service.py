"""What the controller runs for identity: host command consumers and the enrolment service.

A host may not create its own command consumer (permissions.py says why), so the controller
makes one for every admitted, unrevoked host when it starts and for each host it admits while
running; it hands the servers every account of the grid when it starts (a server that missed a
push while it was down, or whose config predates an admission, catches up: accounts.py), and
each new host's account when it admits it; and it answers join/renew requests (enrolment.py) on
its own connection. It keeps its registry and invitations in step with the other controllers'
(grid.identity.shared_registry), and catches up with them before it pushes any account JWT.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from grid.identity.shared_registry import SharedRegistry

log = structlog.get_logger(__name__)

INVITATIONS_FILE = "invitations.json"
# Host command consumers created at once when the controller starts.
PROVISION_CONCURRENCY = 32


def invitation_store(authority: Authority) -> InvitationStore:
    """The one invitation store of a grid: beside the authority (gridctl invite writes it)."""
    return InvitationStore(authority.directory / INVITATIONS_FILE)


class ControllerIdentity:
    def __init__(self, authority_dir: Path, *, ca_pem: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.authority = Authority(authority_dir)
        self.enrolment = EnrolmentService(self.authority, invitation_store(self.authority), clock=clock,
                                          ca_pem=ca_pem, on_admitted=self._provision,
                                          on_changed=self.registry_changed)
        self._log: EventLog | None = None
        self._clock = clock
        # The registry shared with the other controllers (a JetStream log only).
        self.shared: SharedRegistry | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def warnings(self) -> list[str]:
        return self.shared.warnings() if self.shared is not None else []

    async def registry_changed(self) -> None:
        """Publish what this controller changed (a join, a renewal, a revocation) at once."""
        if self.shared is None:
            return
        try:
            await self.shared.publish_changes()
        except Exception as exc:  # the poll publishes it later
            log.warning("identity.shared_publish_failed", error=f"{type(exc).__name__}: {exc}")

    async def _provision(self, host: Principal) -> None:
        assert self._log is not None
        await provision_host_consumer(self._log, host)

    async def start(self, event_log: EventLog, nc: Any, answering: Callable[[], bool] | None = None) -> None:
        """Provision every admitted host's consumer, then serve enrolment on `nc` (the
        controller's own NATS connection), answering while `answering()` (the lease holder)."""
        self._log = event_log
        if answering is not None:
            self.enrolment.answering = answering
        authorship = getattr(event_log, "authorship", None)
        if authorship is not None:
            self.enrolment.sign = authorship.sign
        # What the other controllers admitted, revoked and invited first: the consumers made and
        # the account JWTs pushed below are built from the registry (shared_registry says why).
        caught_up = True
        if getattr(event_log, "jetstream", None) is not None:
            self.shared = SharedRegistry(self.authority, self.enrolment.invitations, event_log,
                                         clock=self._clock)
            try:
                await self.shared.catch_up()
            except Exception as exc:  # pushing JWTs from a stale registry could drop hosts: wait
                caught_up = False
                log.warning("identity.shared_registry_unavailable; account JWTs not pushed until it is read",
                            error=f"{type(exc).__name__}: {exc}")
        # Consumer creations run PROVISION_CONCURRENCY at a time: each is a JetStream API round
        # trip (a Raft proposal on a replicated stream), so one at a time kept a controller of
        # thousands of hosts from starting for minutes.
        gate = asyncio.Semaphore(PROVISION_CONCURRENCY)

        async def one(host: Principal) -> None:
            async with gate:
                try:
                    await self._provision(host)
                except Exception as exc:  # one bad record must not keep the controller down
                    log.warning("identity.provision_failed", host_id=host.host_id, error=str(exc))

        await asyncio.gather(*(one(host) for host in self.authority.admitted_hosts()))
        if caught_up:
            await self.enrolment.publish_all_accounts(nc)
        await self.enrolment.serve(nc)
        if self.shared is not None:
            self._tasks.append(asyncio.get_running_loop().create_task(self._keep_in_step(nc, caught_up),
                                                                      name="identity-shared-registry"))

    async def _keep_in_step(self, nc: Any, caught_up: bool) -> None:
        """Catch up if the start could not (then push the accounts it held back), then follow."""
        assert self.shared is not None
        if not caught_up:
            while True:
                try:
                    await self.shared.catch_up()
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("identity.shared_registry_unavailable", error=f"{type(exc).__name__}: {exc}")
                    await asyncio.sleep(1.0)
            await self.enrolment.publish_all_accounts(nc)
        await self.shared.run()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        await self.enrolment.stop()
