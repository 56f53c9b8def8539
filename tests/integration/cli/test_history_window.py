"""`gridctl history demand` and `residency` show the last day unless told otherwise: over a long
history they are the store's two largest answers; `--from 0` still reads everything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from grid.analytics.sink import open_store


def gridctl(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GRID_HOME": str(home)}
    env.pop("GRID_NATS_URL", None)
    return subprocess.run([sys.executable, "-m", "grid.cli.main", *args], env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


def test_residency_defaults_to_the_last_day_and_from_zero_reads_everything(tmp_path: Path) -> None:
    db = tmp_path / "analytics.duckdb"
    con = open_store(db)
    now = time.time()
    for seq, (at, state) in enumerate([(now - 3 * 86400, "warming"), (now - 600, "ready")], start=1):
        con.execute("INSERT INTO residencies VALUES ('GRID_HOSTS', ?, 0, ?, 'h1', 'm1', ?, 512, true, 0)",
                    [seq, at, state])
    con.close()
    day = gridctl(tmp_path / "home", "history", "residency", "--json", "--db", str(db))
    assert day.returncode == 0, day.stderr
    assert [r["state"] for r in json.loads(day.stdout)] == ["ready"]
    everything = gridctl(tmp_path / "home", "history", "residency", "--json", "--from", "0", "--db", str(db))
    assert everything.returncode == 0, everything.stderr
    assert [r["state"] for r in json.loads(everything.stdout)] == ["warming", "ready"]
