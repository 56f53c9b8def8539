"""Draining the host with a model's only copy, when no other host has room, warns at once and does
not take the model down at the evacuation deadline.

A real controller with its admin API on the real log; `gridctl host drain` (a child process)
writes the operator override to the log and asks the controller what the drain costs: it names
the model and says the deadline keeps its last copy (safety invariant 5). `gridctl status` shows
the same while the drain lasts, and past the (shortened) deadline no drain is issued for it.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import msgspec

from grid.controller.governor import Limits
from grid.events.base import new_event_id
from grid.events.control import ModelProfile, ModeSet, ProfileSet
from grid.events.host import HostHeartbeat
from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import JetStreamLog

from tests.integration.controller.simhost import SimHost
from tests.integration.controller.statuskit import SETTINGS, serving_controller, status_until
from tests.integration.controller.test_cli_admin import gridctl

SHA = "9a" * 32
DEADLINE = 3.0


class DiskSimHost(SimHost):
    """A simulated host that reports free disk (the planner fetches only onto a host that has room)
    and the digest its copies were proved with, as the agent does."""

    def heartbeat_event(self) -> HostHeartbeat:
        hb = super().heartbeat_event()
        return msgspec.structs.replace(
            hb, disk_free_bytes=50 << 30, disk_total_bytes=100 << 30,
            residencies=tuple(msgspec.structs.replace(r, artifact_sha256=SHA) for r in hb.residencies))


def _flat(text: str) -> str:
    return " ".join(text.split())  # tables and warnings wrap at the terminal width


async def test_draining_the_only_copy_warns_at_once_and_keeps_it_past_the_deadline(
        js_log: JetStreamLog, nats_server: EmbeddedNats, tmp_path: Path) -> None:
    # h1 can hold m (3000 MiB), h2 cannot: the controller loads and warms it on h1 (simulated
    # hosts on the real log, acknowledging like agents), the only place it fits.
    hosts = [DiskSimHost("h1", capacity_mb=4000), DiskSimHost("h2", capacity_mb=2000)]
    for h in hosts:
        await h.heartbeat(js_log)
        h.start(js_log)

    async def beat() -> None:
        for h in hosts:
            await h.heartbeat(js_log)

    await js_log.append(ModeSet(event_id=new_event_id(), at=time.time(), mode="automatic"))
    await js_log.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=ModelProfile(
        model_id="m", memory_mb=3000, artifact_sha256=SHA, artifact_source="https://example.invalid/m.gguf",
        artifact_size_mb=100, min_replicas=1, max_replicas=1)))
    home = tmp_path / "home"
    settings = msgspec.structs.replace(SETTINGS, limits=Limits(evacuation_deadline_seconds=DEADLINE))
    try:
        async with serving_controller(js_log, home, "ctl-drain-last", settings=settings):
            await _drain_and_watch(home, beat, nats_server.url)
    finally:
        for h in hosts:
            await h.stop()


async def _drain_and_watch(home: Path, beat, nats_url: str) -> None:  # type: ignore[no-untyped-def]
    await status_until(home, beat, lambda d: any(m["model_id"] == "m" and m["ready"] == 1 for m in d["models"]),
                       "m ready on h1", timeout=15.0)
    # The drain answers at once: m's last copy is on h1 and h2 has no room.
    rc, out, err = await gridctl(home, "host", "drain", "h1", "--nats", nats_url, "--json")
    assert rc == 0, err
    check = json.loads(out)["drain_check"]
    assert check["known"] and [r["model_id"] for r in check["risks"]] == ["m"], check
    risk = check["risks"][0]
    assert risk["at_deadline"] == "kept_until_replaced" and "h2: insufficient_memory" in risk["detail"], risk
    rc, out, err = await gridctl(home, "host", "drain", "h1", "--nats", nats_url)
    assert rc == 0, err
    said = _flat(err)
    assert "draining host h1: m has its last ready copy there and no other host can take it" in said, said
    assert f"the {DEADLINE:g} s evacuation deadline will not unload it" in said, said

    # `gridctl node drain` on the machine itself says the same when it can reach the admin API.
    state_dir = home.parent / "h1-agent"
    state_dir.mkdir()
    (state_dir / "host_id").write_text("h1\n")
    rc, out, err = await gridctl(home, "node", "drain", "--state-dir", str(state_dir))
    assert rc == 0, err
    assert "draining host h1: m has its last ready copy there" in _flat(err), err

    # Status says so while the drain lasts, before and after the deadline...
    doc = await status_until(home, beat, lambda d: any(x["risks"] for x in d["drains"]), "the drain in status")
    assert [(x["host_id"], [r["model_id"] for r in x["risks"]]) for x in doc["drains"]] == [("h1", ["m"])]
    assert any("m has its last ready copy there" in w for w in doc["warnings"]), doc["warnings"]
    doc = await status_until(home, beat, lambda d: bool(d["drains"]) and all(x["deadline_passed"] for x in d["drains"]),
                             "the evacuation deadline passed")
    for _ in range(5):  # a few ticks past the deadline
        await beat()
        await asyncio.sleep(0.4)
    rc, out, err = await gridctl(home, "status", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    # ...and the deadline did not take the last copy: no drain of it, ever.
    drains = [c for c in doc["pending_commands"] + doc["history"] if c["kind"] == "drain"]
    assert not drains and not [a for a in doc["reconciliation"]["actions"] if a["kind"] == "drain"], drains
    assert [x["risks"][0]["model_id"] for x in doc["drains"]] == ["m"]
    rc, out, err = await gridctl(home, "status")
    assert rc == 0, err
    assert "draining h1: evacuation deadline passed; m kept until replaced" in _flat(out), out
