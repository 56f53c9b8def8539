"""Determinism guard on a real nats-server: every recorded plan replays byte for byte.

The session is recorded on real JetStream (heartbeats, profiles, request batches, and plans the
controller's way), then replayed through `gridctl replay` from JetStream, from an export file
written by `gridctl events export`, and from the DuckDB store filled by the analytics sink.
Bad input (a malformed event, an unknown planner path) fails with the sequence or the path,
and writes nothing to the store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from grid.clock import SystemClock
from grid.events.subjects import HOSTS_STREAM, host_subject
from replay import LogSource, replay_window
from tests.unit.replay.session import Session

pytestmark = pytest.mark.slow


def gridctl(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    """This checkout's gridctl (the interpreter running the tests), never whatever is on PATH."""
    proc = subprocess.run([sys.executable, "-m", "grid.cli.main", *args], capture_output=True, text=True, env=env,
                          timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"gridctl {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def runs_in(db: Path) -> int:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT count(*) FROM replay_runs").fetchone()[0]  # type: ignore[index]
    finally:
        con.close()


@pytest.fixture
def cli_env(nats_server, grid_home) -> dict[str, str]:
    env = dict(os.environ)
    env["GRID_HOME"] = str(grid_home)
    env["GRID_NATS_URL"] = nats_server.url
    return env


async def test_recorded_session_replays_byte_for_byte_from_every_source(js_log, cli_env, tmp_path) -> None:
    session = Session(js_log, SystemClock(), hosts=5, models=3, seed=3)
    plans = await session.run(rounds=5)
    assert len(plans) == 5

    # In-process, straight from JetStream.
    direct = await replay_window(LogSource(js_log))
    assert direct.reproduced, direct.summary
    assert direct.summary.plans_compared == 5

    db = tmp_path / "analytics.duckdb"
    # gridctl replay from JetStream: the determinism guard (--check) passes and the run is stored.
    out = json.loads(gridctl("replay", "--check", "--json", "--db", str(db), env=cli_env).stdout)
    assert out["reproduced"] is True
    assert out["summary"] == {"plans_compared": 5, "identical": 5, "equivalent": 0, "differing": 0,
                              "digest_mismatches": 0, "based_on_drift": 0}
    assert runs_in(db) == 1

    # From an export file.
    export = tmp_path / "session.ndjson"
    gridctl("events", "export", "-o", str(export), env=cli_env)
    out = json.loads(gridctl("replay", "--source", "file", "--file", str(export), "--check", "--json",
                             "--db", str(db), env=cli_env).stdout)
    assert out["reproduced"] is True and out["source"] == "file"

    # From the DuckDB store, filled from NATS by the analytics sink (--sync).
    out = json.loads(gridctl("replay", "--source", "duckdb", "--sync", "--check", "--json",
                             "--db", str(db), env=cli_env).stdout)
    assert out["reproduced"] is True and out["source"] == "duckdb"
    assert runs_in(db) == 3

    # A candidate planner: differences with both explanations, stored under the run id.
    out = json.loads(gridctl("replay", "--planner", "tests.unit.replay.planners:without_first_host", "--json",
                             "--db", str(db), env=cli_env).stdout)
    assert out["summary"]["differing"] > 0 and out["reproduced"] is False
    table = gridctl("replay", "--planner", "tests.unit.replay.planners:without_first_host", "--no-store",
                    "--db", str(db), env=cli_env).stdout
    assert "differences" in table and "host-0" in table
    listed = json.loads(gridctl("history", "replays", "--json", "--db", str(db), env=cli_env).stdout)
    assert len(listed) == 4
    one = json.loads(gridctl("history", "replays", "--run", out["run_id"][:10], "--json", "--db", str(db),
                             env=cli_env).stdout)
    assert len(one["plans"]) == 5 and len(one["differences"]) == sum(len(p["differences"]) for p in out["plans"])

    # History over the same store.
    hist = json.loads(gridctl("history", "plans", "--json", "--db", str(db), env=cli_env).stdout)
    assert [r["seq"] for r in hist] == [1, 2, 3, 4, 5]
    assert hist[0]["added"] and all(r["planner_version"] for r in hist)
    timeline = json.loads(gridctl("history", "residency", "--json", "--db", str(db), env=cli_env).stdout)
    assert {r["state"] for r in timeline} >= {"warming", "ready"}
    demand = json.loads(gridctl("history", "demand", "--json", "--db", str(db), env=cli_env).stdout)
    assert sum(r["requests"] for r in demand) == 5 * 20
    commands = json.loads(gridctl("history", "commands", "--json", "--db", str(db), env=cli_env).stdout)
    # The session's ticks reconcile: each new placement is a load, then a warm that depends on it.
    assert {c["kind"] for c in commands} >= {"load", "warm"}


async def test_bad_input_names_the_sequence_or_path_and_writes_nothing(js_log, cli_env, tmp_path) -> None:
    session = Session(js_log, SystemClock(), hosts=3, models=2, seed=5)
    await session.run(rounds=2)
    db = tmp_path / "analytics.duckdb"
    gridctl("replay", "--check", "--json", "--db", str(db), env=cli_env)
    assert runs_in(db) == 1

    proc = gridctl("replay", "--planner", "grid.planner.no_such_planner:plan", "--db", str(db), env=cli_env, check=False)
    assert proc.returncode == 2
    assert "grid.planner.no_such_planner:plan" in proc.stderr and "nothing was written" in proc.stderr

    bad = await js_log.append_raw(host_subject("host-1", "heartbeat"), b'{"type": "host.heartbeat.v1", "host_id": 7}')
    await session.heartbeats()
    await session.tick()
    proc = gridctl("replay", "--db", str(db), env=cli_env, check=False)
    assert proc.returncode == 2
    assert f"{HOSTS_STREAM} sequence {bad.seq}" in " ".join(proc.stderr.split())
    assert runs_in(db) == 1

    # The same from an export file, and from the DuckDB store.
    export = tmp_path / "bad.ndjson"
    gridctl("events", "export", "-o", str(export), env=cli_env)
    proc = gridctl("replay", "--file", str(export), "--db", str(db), env=cli_env, check=False)
    assert proc.returncode == 2 and f"sequence {bad.seq}" in " ".join(proc.stderr.split())
    proc = gridctl("replay", "--source", "duckdb", "--sync", "--db", str(db), env=cli_env, check=False)
    assert proc.returncode == 2 and f"sequence {bad.seq}" in " ".join(proc.stderr.split())
    assert runs_in(db) == 1
