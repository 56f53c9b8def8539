"""`gridctl history memory`: resident memory per host and time window, from a real store file."""

from __future__ import annotations

import json
import time
from pathlib import Path

from grid.analytics.sink import AnalyticsSink, open_store
from grid.events import codec
from grid.events.host import HostHeartbeat, HostResources, Residency
from grid.events.log import StoredMessage
from grid.events.subjects import HOSTS_STREAM, subject_for

from tests.integration.cli.test_history_window import gridctl


def test_memory_per_host_per_window(tmp_path: Path) -> None:
    db = tmp_path / "analytics.duckdb"
    con = open_store(db)
    sink = AnalyticsSink(con)
    start = (time.time() // 300) * 300 - 3600
    beats = [(start + 10, "h1", (Residency(model_id="m1", memory_mb=512, state="ready"),)),
             (start + 20, "h1", (Residency(model_id="m1", memory_mb=512, state="ready"),
                                 Residency(model_id="m2", memory_mb=256, state="loading"),
                                 Residency(model_id="m3", memory_mb=900, state="cached"))),
             (start + 400, "h1", ()),
             (start + 30, "h2", (Residency(model_id="m1", memory_mb=512, state="failed"),))]
    for seq, (at, host, residencies) in enumerate(beats, start=1):
        hb = HostHeartbeat(event_id=f"hb-{seq}", at=at, host_id=host, resources=HostResources(capacity_mb=8000),
                           residencies=residencies)
        sink.add(StoredMessage(stream=HOSTS_STREAM, seq=seq, subject=subject_for(hb), data=codec.encode(hb), time=at))
    sink.flush()
    con.close()
    out = gridctl(tmp_path / "home", "history", "memory", "--json", "--db", str(db))
    assert out.returncode == 0, out.stderr
    # The highest report per 5-minute window; cached and failed residencies hold no process memory.
    assert json.loads(out.stdout) == [
        {"host": "h1", "bucket": start, "memory_mb": 768},
        {"host": "h1", "bucket": start + 300, "memory_mb": 0},
        {"host": "h2", "bucket": start, "memory_mb": 0},
    ]
    table = gridctl(tmp_path / "home", "history", "memory", "--db", str(db))
    assert table.returncode == 0 and "resident memory per host" in table.stdout, table.stderr
