"""The analytics sink on a real full disk: a failed flush reports the disk, not the ROLLBACK that
followed it, stores nothing of the batch, is not taken for damage, and the same sink stores the
batch once the space is freed. The store lives on a small tmpfs this test mounts."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from grid.analytics.service import damage
from grid.analytics.sink import AnalyticsSink, open_store
from grid.events import codec
from grid.events.base import new_event_id
from grid.events.log import StoredMessage
from grid.events.requests import RequestCompleted, RequestFeatures
from tests.tmpfs import mount_tmpfs, unmount

BATCH = 2000


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount_tmpfs(mount, 8)
    try:
        yield mount
    finally:
        unmount(mount)


def _add(sink: AnalyticsSink, first_seq: int, count: int) -> None:
    for seq in range(first_seq, first_seq + count):
        now = time.time()
        event = RequestCompleted(event_id=new_event_id(), at=now, features=RequestFeatures(
            endpoint="chat", requested_model="m-a", served_model="m-a", host_id="host-1", input_units=10,
            output_units=20, service_seconds=0.2, finished_at=now))
        sink.add(StoredMessage(stream="GRID_REQS", seq=seq, subject="grid.req.completed", time=now,
                               data=codec.encode(event), headers={}))


def _fill(path: Path) -> None:
    with open(path, "ab", buffering=0) as f:
        while True:
            try:
                f.write(b"\0" * 65536)
            except OSError:
                return


def test_a_full_disk_is_reported_as_such_and_the_batch_is_stored_once_freed(small_disk: Path) -> None:
    con = open_store(small_disk / "analytics.duckdb")
    try:
        sink = AnalyticsSink(con)
        _add(sink, 1, 1)
        sink.flush()
        assert sink.positions() == {"GRID_REQS": 1}

        filler = small_disk / "filler"
        _fill(filler)
        _add(sink, 2, BATCH)
        with pytest.raises(duckdb.Error) as info:
            sink.flush()
        # The cause leads; the ROLLBACK's own complaint is only a note.
        assert "No space left on device" in str(info.value), info.value
        assert "no transaction is active" not in str(info.value)
        assert damage(info.value) is None  # a full disk is not a damaged store: no quarantine
        assert sink.positions() == {"GRID_REQS": 1}  # nothing of the batch was stored

        filler.unlink()
        _add(sink, 2, BATCH)  # the follower reads the batch again from the stored position
        sink.flush()
        assert sink.positions() == {"GRID_REQS": 1 + BATCH}
        assert con.execute("SELECT count(*) FROM sink_positions").fetchone() == (1,)
    finally:
        con.close()
