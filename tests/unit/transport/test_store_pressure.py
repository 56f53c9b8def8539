"""The store's disk pressure from one reading (pure): which state, and when a restart helps."""

from __future__ import annotations

from grid.transport.store_pressure import (
    MIB,
    STORE_LOW_SPACE,
    STORE_OK,
    STORE_UNKNOWN,
    STORE_WRITE_FAILED,
    assess,
    restart_needs_free_bytes,
    warn_free_bytes,
)

JSZ = {"storage": 3 * MIB, "reserved_storage": 256 * MIB, "config": {"max_storage": 384 * MIB}}
WRITE_ERROR = ("JetStream stream 'A > GRID_HOSTS' write error: write /s/GRID_HOSTS/msgs/1.blk: "
               "no space left on device")


def reading(free: int, *, jsz: dict | None = JSZ, error: str | None = None, reachable: bool = True):
    return assess(path="/store", free_bytes=free, total_bytes=512 * MIB, jsz=jsz, health_error=error,
                  reachable=reachable, reserved_bytes=128 * MIB)


def test_warning_threshold_is_a_tenth_of_the_disk_within_bounds() -> None:
    assert warn_free_bytes(512 * MIB) == int(51.2 * MIB)
    assert warn_free_bytes(10 * MIB) == 32 * MIB
    assert warn_free_bytes(1 << 40) == 1 << 30


def test_plenty_of_room_is_ok_and_reports_jetstream_usage() -> None:
    p = reading(400 * MIB)
    assert (p.state, p.detail) == (STORE_OK, "")
    assert (p.jetstream_storage_bytes, p.jetstream_reserved_bytes, p.jetstream_max_bytes) == \
        (3 * MIB, 256 * MIB, 384 * MIB)
    assert not p.recoverable


def test_low_free_space_warns_before_writes_fail() -> None:
    p = reading(20 * MIB)
    assert p.state == STORE_LOW_SPACE
    assert "20 MiB free" in p.detail and "51 MiB" in p.detail


def test_a_failed_write_is_recoverable_only_once_the_reservations_fit_again() -> None:
    full = reading(0, error=WRITE_ERROR)
    assert full.state == STORE_WRITE_FAILED and "no space left on device" in full.detail
    assert full.restart_needs_free_bytes == restart_needs_free_bytes(256 * MIB) > 256 * MIB
    assert not full.recoverable  # a server started now would refuse the streams
    assert f"restarted once {full.restart_needs_free_bytes // MIB} MiB are free" in full.detail
    assert reading(full.restart_needs_free_bytes, error=WRITE_ERROR).recoverable


def test_other_health_errors_are_not_a_failed_store() -> None:
    assert reading(400 * MIB, error="JetStream is not current with the meta leader").state == STORE_OK


def test_an_unread_server_keeps_the_last_known_reservations() -> None:
    p = reading(400 * MIB, jsz=None, reachable=False)
    assert p.state == STORE_UNKNOWN
    assert p.jetstream_reserved_bytes == 128 * MIB and p.jetstream_storage_bytes is None
