"""gridctl events export / tail against a real nats-server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from grid.events import codec
from grid.events.control import ModelProfile, ProfileSet
from grid.events.host import HostHeartbeat, HostResources
from grid.events.subjects import host_subject


def run(nats_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GRID_NATS_URL": nats_url, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "grid.cli.main", "events", *args], env=env,
                          capture_output=True, text=True, timeout=60)


async def test_export_window_as_ndjson_round_trips_events(js_log, nats_server, tmp_path) -> None:
    before = time.time()
    hb = HostHeartbeat(event_id="hb-1", at=0, host_id="host.a", resources=HostResources(capacity_mb=2048))
    prof = ProfileSet(event_id="p-1", at=0, profile=ModelProfile(model_id="m.gguf", memory_mb=300))
    await js_log.append(hb)
    await js_log.append(prof)
    await js_log.append_raw(host_subject("host.a", "heartbeat"), b"{broken", msg_id="bad")
    out = tmp_path / "window.ndjson"
    result = run(nats_server.url, "export", "--from", str(before - 5), "--to", str(time.time() + 5), "-o", str(out))
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    by_type = {row["type"]: row for row in lines}
    assert len(lines) == 3
    assert codec.decode(json.dumps(by_type["host.heartbeat.v1"]["event"]).encode()) == hb
    assert codec.decode(json.dumps(by_type["control.profile_set.v1"]["event"]).encode()) == prof
    broken = [row for row in lines if not row["valid"]]
    assert len(broken) == 1 and broken[0]["event"] == "{broken" and broken[0]["seq"] == 2

    # A window that ends before anything was written exports nothing.
    empty = run(nats_server.url, "export", "--to", str(before - 60))
    assert empty.returncode == 0 and empty.stdout == ""


async def test_tail_json_and_table(js_log, nats_server) -> None:
    for i in range(5):
        await js_log.append(HostHeartbeat(event_id=f"t-{i}", at=0, host_id="h", resources=HostResources(capacity_mb=i + 1)))
    result = run(nats_server.url, "tail", "--stream", "hosts", "-n", "2", "--json")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["seq"] for r in rows] == [4, 5]
    table = run(nats_server.url, "tail", "--stream", "hosts", "-n", "1")
    assert "host.heartbeat.v1" in table.stdout


def test_bad_arguments_are_clear_errors(nats_server) -> None:
    bad_stream = run(nats_server.url, "tail", "--stream", "nope")
    assert bad_stream.returncode != 0 and "unknown stream" in bad_stream.stderr
    bad_time = run(nats_server.url, "export", "--from", "yesterday-ish")
    assert bad_time.returncode != 0 and "cannot read time" in bad_time.stderr
    no_server = subprocess.run([sys.executable, "-m", "grid.cli.main", "events", "tail", "--nats", "nats://127.0.0.1:1"],
                               capture_output=True, text=True, timeout=60, env={**os.environ, "GRID_HOME": "/nonexistent-grid-home"})
    assert no_server.returncode != 0 and "cannot connect" in no_server.stderr
