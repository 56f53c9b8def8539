"""The agent's operator override from the log (grid.agent.overrides.LogOverrides): honoured only
when an operator or controller provably wrote it for this host; anything else leaves the override
last proven in force."""

from __future__ import annotations

import time
from pathlib import Path

from grid.agent.overrides import LogOverrides, stricter
from grid.agent.protection import Override
from grid.events.base import new_event_id
from grid.events.control import HostOverride
from grid.events.log import InMemoryLog
from grid.identity.signing import Identity
from tests.identities import Identities


def override(state: str | None, host_id: str = "h2", **kw: object) -> HostOverride:
    return HostOverride(event_id=new_event_id(), at=time.time(), host_id=host_id, state=state, **kw)  # type: ignore[arg-type]


async def append_as(log: InMemoryLog, who: Identity, event: HostOverride) -> None:
    own, log.authorship = log.authorship, who
    try:
        await log.append(event)
    finally:
        log.authorship = own


async def test_operator_and_controller_overrides_apply_and_forgeries_change_nothing(tmp_path: Path) -> None:
    ids = Identities(tmp_path)
    log = InMemoryLog(authorship=ids.controller)
    warnings: list[str] = []
    reader = LogOverrides(log, "h2", warnings.append)
    assert await reader.refresh() is None

    await append_as(log, ids.operator, override("paused", reason="maintenance", expires_at=2e9))
    got = await reader.refresh()
    assert got is not None and (got.state, got.reason, got.expires_at) == ("paused", "maintenance", 2e9)

    # A host (even this one) may not write control events: ignored, the pause stays.
    await append_as(log, ids.host("h2"), override(None))
    assert (await reader.refresh()) == got
    await append_as(log, ids.host("h1"), override("quarantined"))
    assert (await reader.refresh()) == got
    # Unsigned bytes prove nothing either.
    own, log.authorship = log.authorship, None
    await log.append(override(None))
    log.authorship = own
    assert (await reader.refresh()) == got
    # Signed by the controller but no override event: ignored too.
    await log.append_raw("grid.ctl.override.h2", b'{"type":"control.host_override.v1"}')
    assert (await reader.refresh()) == got
    assert reader.ignored.pop("not_permitted") == 2 and reader.ignored.pop("unsigned") == 1
    assert [k.split(":")[0] for k in reader.ignored] == ["undecodable"]
    assert len(warnings) == 4

    # The controller may write it too, and a release releases.
    await append_as(log, ids.controller, override("draining"))
    assert (await reader.refresh()).state == "draining"  # type: ignore[union-attr]
    await append_as(log, ids.operator, override(None))
    assert await reader.refresh() is None
    # Another host's override is not this host's.
    await append_as(log, ids.operator, override("paused", host_id="h1"))
    assert await reader.refresh() is None


def test_the_stricter_override_applies() -> None:
    drain, quarantine = Override(state="draining"), Override(state="quarantined")
    assert stricter(drain, quarantine) is quarantine and stricter(quarantine, drain) is quarantine
    assert stricter(None, drain) is drain and stricter(drain, None) is drain and stricter(None, None) is None


def test_host_cli_durations() -> None:
    import pytest

    from grid.cli.host import parse_duration

    assert [parse_duration(v) for v in ("90", "90s", "15m", "2h", "1d", "1.5h")] == [90, 90, 900, 7200, 86400, 5400]
    for bad in ("0", "-5m", "2w", "", "1y", "400d"):
        with pytest.raises(ValueError):
            parse_duration(bad)
