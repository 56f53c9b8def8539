"""A real controller with its admin API, and `gridctl status` read until a condition holds."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from grid.controller.api import serve_admin
from grid.controller.service import Controller, ControllerSettings
from grid.identity.service import ControllerIdentity
from grid.transport.jetstream import JetStreamLog

from tests.integration.controller.test_cli_admin import gridctl

SETTINGS = ControllerSettings(tick_interval_seconds=0.3, coalesce_seconds=0.02, lease_ttl_seconds=3.0,
                              lease_renew_seconds=0.5, restart_grace_seconds=0.0)


@contextlib.asynccontextmanager
async def serving_controller(log: JetStreamLog, home: Path, controller_id: str,
                             settings: ControllerSettings = SETTINGS,
                             identity: ControllerIdentity | None = None) -> AsyncIterator[Controller]:
    """A controller with its admin API (what `gridctl status` reads), stopped on exit; with
    `identity`, as `gridctl up` runs it on the authority's machine."""
    ctl = Controller(log, home, settings=settings, controller_id=controller_id, identity=identity)
    await ctl.start()
    admin = await serve_admin(ctl, "127.0.0.1", 0)
    try:
        yield ctl
    finally:
        await admin.stop()
        await ctl.stop()


async def status_until(home: Path, heartbeat: Callable[[], Awaitable[None]], done: Callable[[dict[str, Any]], bool],
                       what: str, timeout: float = 20.0) -> dict[str, Any]:
    """Heartbeat and read `gridctl status --json` until `done(document)`; the document."""
    deadline = time.monotonic() + timeout
    while True:
        await heartbeat()
        rc, out, err = await gridctl(home, "status", "--json")
        assert rc == 0, err
        doc: dict[str, Any] = json.loads(out)
        if done(doc):
            return doc
        assert time.monotonic() < deadline, f"{what} not within {timeout:g}s"
        await asyncio.sleep(0.3)
