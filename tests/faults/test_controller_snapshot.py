"""A controller snapshot that does not describe the log is discarded, not trusted (real nats-server).

The fault: a snapshot whose GRID_CTL position was raised past the stream's last sequence made a
restarted controller skip every control event up to that position, so `model set` and `mode
automatic` were acknowledged and never took effect. The same happens with a snapshot taken from
an earlier incarnation of the streams (deleted and created again).
"""

from __future__ import annotations

import json
from pathlib import Path

from grid.controller.service import SNAPSHOT_NAME, Controller, ControllerSettings
from grid.events.base import new_event_id
from grid.events.control import ModelProfile, ModeSet, ProfileSet
from grid.events.subjects import ALL_STREAMS, CONTROL_STREAM
from grid.transport.jetstream import JetStreamLog

from tests.conftest import ensure_streams_after_delete

SETTINGS = ControllerSettings(background_ticks=False, lease_ttl_seconds=3.0, lease_renew_seconds=0.5,
                              restart_grace_seconds=0.0)


def profile_set(model: str) -> ProfileSet:
    return ProfileSet(event_id=new_event_id(), at=0, profile=ModelProfile(model_id=model, memory_mb=100))


async def run_once(log: JetStreamLog, home: Path) -> None:
    """Start a controller, let it fold the log, stop it (which writes the snapshot)."""
    ctl = Controller(log, home, settings=SETTINGS, controller_id="ctl-snap")
    await ctl.start()
    await ctl.stop()
    assert (home / "snapshots" / SNAPSHOT_NAME).exists()


async def test_a_snapshot_position_past_the_stream_end_is_discarded(js_log: JetStreamLog, tmp_path: Path) -> None:
    home = tmp_path / "home"
    await js_log.append(profile_set("before"))
    await run_once(js_log, home)
    path = home / "snapshots" / SNAPSHOT_NAME
    snap = json.loads(path.read_bytes())
    snap["positions"][CONTROL_STREAM] += 50  # the fault: a position the stream never reached
    path.write_text(json.dumps(snap))

    ctl = Controller(js_log, home, settings=SETTINGS, controller_id="ctl-snap")
    await ctl.start()
    try:
        # Acknowledged control events after the restart must take effect.
        await ctl.append_control(profile_set("after"))
        await ctl.append_control(ModeSet(event_id=new_event_id(), at=0, mode="observe"))
        catalog = ctl.runner["catalog"]
        assert sorted(catalog.profiles) == ["after", "before"]
        assert catalog.mode == "observe"
        assert ctl.runner.positions[CONTROL_STREAM] == await js_log.last_sequence(CONTROL_STREAM)
        warnings = ctl.status()["warnings"]
        assert any("snapshot" in w and "past the stream's last sequence" in w for w in warnings), warnings
        assert list(path.parent.glob(f"{SNAPSHOT_NAME}.stale-*"))
    finally:
        await ctl.stop()


async def recreate_streams(log: JetStreamLog) -> None:
    js = log.client.jetstream()
    for name in ALL_STREAMS:
        await js.delete_stream(name)
    await ensure_streams_after_delete(log)


async def test_a_snapshot_from_another_stream_incarnation_is_discarded(js_log: JetStreamLog, tmp_path: Path) -> None:
    home = tmp_path / "home"
    await js_log.append(profile_set("old-1"))
    await js_log.append(profile_set("old-2"))
    await run_once(js_log, home)

    # The streams are deleted and created again; the new log grows past the snapshot's positions.
    await recreate_streams(js_log)
    for model in ("new-1", "new-2", "new-3"):
        await js_log.append(profile_set(model))

    ctl = Controller(js_log, home, settings=SETTINGS, controller_id="ctl-snap")
    await ctl.start()
    try:
        assert sorted(ctl.runner["catalog"].profiles) == ["new-1", "new-2", "new-3"]
        assert any("another incarnation" in w for w in ctl.status()["warnings"])
    finally:
        await ctl.stop()


async def test_a_snapshot_that_matches_the_log_is_kept(js_log: JetStreamLog, tmp_path: Path) -> None:
    home = tmp_path / "home"
    await js_log.append(profile_set("a"))
    await run_once(js_log, home)
    await js_log.append(profile_set("b"))

    ctl = Controller(js_log, home, settings=SETTINGS, controller_id="ctl-snap")
    await ctl.start()
    try:
        assert sorted(ctl.runner["catalog"].profiles) == ["a", "b"]
        assert not any("snapshot" in w for w in ctl.status()["warnings"])
        assert not list((home / "snapshots").glob(f"{SNAPSHOT_NAME}.*-*"))
    finally:
        await ctl.stop()
