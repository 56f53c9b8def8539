"""A full disk under `gridctl up`'s event log, then freed: the grid serves again by itself.

Real processes: `gridctl up` (embedded nats-server with auth, controller, gateway, agent, llama.cpp
with the SmolLM2 GGUF) whose JetStream store lives on a small tmpfs this test mounts. Filling it
first shows as pressure in `gridctl status --json`, the status table and /metrics; filling it
completely makes the server stop storing (heartbeats are lost, the host goes stale, chats fail
with a clear answer); removing the filler brings the store back without anyone restarting
anything, and chats succeed again within a bounded time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.faults.test_up_nats_restart import GRIDCTL, MODEL, Up, stop_up
from tests.tmpfs import mount_tmpfs, unmount

pytestmark = [pytest.mark.engine, pytest.mark.slow]

MIB = 1 << 20
STORE_SIZE_MIB = 512
# Room a filler leaves for "low but not yet out" (the warning threshold is a tenth of the disk).
LOW_LEFT_MIB = 24
RECOVERY_SECONDS = 90.0


@pytest.fixture
def up_on_tmpfs(tmp_path: Path, bundled_model_home: Path, engine_runtime: object) -> Iterator[Up]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    home = tmp_path / "home"
    home.mkdir()
    (home / "artifacts").symlink_to(bundled_model_home / "artifacts")
    store = home / "nats"
    mount_tmpfs(store, STORE_SIZE_MIB)
    env = {**os.environ, "GRID_HOME": str(home), "COLUMNS": "200"}
    env.pop("GRID_NATS_URL", None)
    env.pop("GRID_LOG_BUDGET", None)
    log_path = tmp_path / "up.log"
    try:
        with open(log_path, "w") as log:
            proc = subprocess.Popen([*GRIDCTL, "up", "--port", "0", "--no-dashboard"], env=env, stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        up = Up(home, env, proc, log_path)
        try:
            up.wait_for("ready:", 180)
            yield up
        finally:
            stop_up(up)
    finally:
        unmount(store)


def _status(up: Up) -> dict:
    done = subprocess.run([*GRIDCTL, "status", "--json"], env=up.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _status_table(up: Up) -> str:
    done = subprocess.run([*GRIDCTL, "status"], env=up.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def _metric(admin: str, name: str, labels: str = "") -> float | None:
    text = httpx.get(f"{admin}/metrics", timeout=10).text
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    return None if match is None else float(match.group(1))


def _chat(gateway: str) -> tuple[int, dict]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2}
    try:
        r = httpx.post(f"{gateway}/v1/chat/completions", json=body, timeout=30)
    except httpx.HTTPError:
        return 598, {}
    with contextlib.suppress(ValueError):
        return r.status_code, r.json()
    return r.status_code, {}


def _wait_store(up: Up, state: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    store: dict | None = None
    while time.monotonic() < deadline:
        store = _status(up)["store"]
        if store is not None and store["state"] == state:
            return store
        time.sleep(1.0)
    raise AssertionError(f"the store did not report {state} within {timeout}s: {store}\n{up.text()[-3000:]}")


def _fill(path: Path, leave_bytes: int) -> None:
    """Write zeros to `path` until its filesystem has at most `leave_bytes` free (0: until full)."""
    with open(path, "ab", buffering=0) as f:  # unbuffered: nothing left to flush into a full disk
        while True:
            stat = os.statvfs(path)
            free = stat.f_bavail * stat.f_frsize
            if free <= leave_bytes:
                return
            try:
                f.write(b"\0" * min(MIB, free - leave_bytes if leave_bytes else MIB))
            except OSError:
                return  # the disk is full


def test_disk_full_then_freed_recovers_without_a_restart_by_hand(up_on_tmpfs: Up) -> None:
    up = up_on_tmpfs
    text = up.text()
    gateway = re.search(r"gateway\s+(http://\S+)/v1", text).group(1)  # type: ignore[union-attr]
    admin = re.search(r"admin API\s+(http://\S+)/allocator/status", text).group(1)  # type: ignore[union-attr]
    store_dir = up.home / "nats"
    assert _chat(gateway)[0] == 200

    # Before it bites: the store reports its free space, the threshold and JetStream's usage.
    store = _wait_store(up, "ok", 30)
    assert store["path"] == str(store_dir)
    assert 0 < store["free_bytes"] <= store["total_bytes"] <= STORE_SIZE_MIB * MIB
    assert store["jetstream_reserved_bytes"] >= store["jetstream_storage_bytes"] > 0
    assert _metric(admin, "grid_store_free_bytes") == pytest.approx(store["free_bytes"], rel=0.2)
    assert _metric(admin, "grid_store_jetstream_reserved_bytes") == store["jetstream_reserved_bytes"]

    filler = store_dir / "filler"
    _fill(filler, LOW_LEFT_MIB * MIB)
    low = _wait_store(up, "low_free_space", 30)
    assert low["free_bytes"] < low["warn_free_bytes"]
    assert any("event log store" in w and "MiB free" in w for w in _status(up)["warnings"])
    assert _metric(admin, "grid_store_state", '{state="low_free_space"}') == 1.0
    assert "event log store (local disk): low_free_space" in " ".join(_status_table(up).split())

    # Full: the server stops storing, heartbeats are lost and chats fail with a clear answer.
    _fill(filler, 0)
    failed = _wait_store(up, "write_failed", 120)
    assert "no space left on device" in failed["detail"]
    assert "it is restarted once" in failed["detail"]  # and says what it waits for
    assert _metric(admin, "grid_store_state", '{state="write_failed"}') == 1.0
    deadline = time.monotonic() + 120
    while True:
        code, body = _chat(gateway)
        if code == 503:
            assert body["error"]["code"], body  # a reason, not an empty failure
            break
        assert time.monotonic() < deadline, f"chats still answered {code} with the disk full"
        time.sleep(2.0)

    # Freed: no restart by hand; the store comes back and chats succeed within a bounded time.
    filler.unlink()
    freed = time.monotonic()
    while _chat(gateway)[0] != 200:
        assert time.monotonic() - freed < RECOVERY_SECONDS, \
            f"chats did not succeed within {RECOVERY_SECONDS}s of freeing the disk:\n{up.text()[-3000:]}"
        time.sleep(1.0)
    recovered = _wait_store(up, "ok", 30)
    assert recovered["recoveries"] >= 1
    assert _metric(admin, "grid_store_recoveries_total") >= 1
    assert "stopped storing after a failed write" in up.text()
    assert up.proc.poll() is None
