"""`gridctl up` on a GRID_HOME with little free disk is refused at once, clearly, with nothing started.

Real parts: `gridctl up` in a subprocess whose GRID_HOME is a 400 MiB tmpfs this test mounts, with
the bundled model not cached there. 400 MiB hold the event log's minimum reservation alone (the
old check) but not beside the model's copy: `up` used to download the model and then fail on a
JetStream stream with "insufficient storage resources". It must say instead what it needs, what
is free and where, before fetching or starting anything.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.tmpfs import mount_tmpfs, unmount

pytestmark = pytest.mark.integration

HOME_SIZE_MIB = 400


@pytest.fixture
def small_home(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    home = tmp_path / "home"
    mount_tmpfs(home, HOME_SIZE_MIB)
    try:
        yield home
    finally:
        unmount(home)
    assert not os.path.ismount(home)


def _processes_using(path: Path) -> list[psutil.Process]:
    """Processes whose command line names `path` (an embedded nats-server names its config there)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(str(path) in arg for arg in proc.info["cmdline"] or ()):
            found.append(proc)
    return found


def test_up_with_too_little_disk_says_what_it_needs_and_starts_nothing(small_home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("GRID_NATS_URL", "GRID_LOG_BUDGET")} | {
        "GRID_HOME": str(small_home), "COLUMNS": "300"}
    started = time.monotonic()
    up = subprocess.run([sys.executable, "-m", "grid.cli.main", "up", "--port", "0", "--no-dashboard"], env=env,
                        capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    took = time.monotonic() - started
    message = " ".join(up.stderr.split())
    assert up.returncode == 1, up.stdout[-2000:] + up.stderr[-2000:]
    assert "insufficient storage" not in message
    assert f"not enough disk space to start a grid in GRID_HOME {small_home}" in message, up.stderr
    assert f"{HOME_SIZE_MIB}.0 MiB free" in message or f"{HOME_SIZE_MIB - 1}." in message, up.stderr
    for need in ("bundled SmolLM2 model", "event log", "log budget", "working room", "MiB needed"):
        assert need in message, up.stderr
    assert took < 30, f"refused only after {took:.0f}s: the check must come before anything is fetched"
    # Nothing was fetched, started or left for other commands to find.
    assert sorted(p.name for p in small_home.iterdir()) in ([], ["lost+found"]), list(small_home.iterdir())
    assert _processes_using(small_home) == []
