"""Process records survive a wall-clock correction, and still refuse a reused pid.

The kernel reports its boot time as the wall clock minus the uptime, so an NTP step, a slew or
a virtual machine's pause moves it, and psutil's `create_time()` of every process with it. These
tests move the boot time psutil sees (`correct_clock`) rather than the machine's clock, which
every other process here depends on. Each checks first that the move took effect, so it cannot
pass vacuously: a create_time comparison alone then calls a live process gone or reused.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from grid.agent.engines import llama_cpp
from grid.agent.inventory import CapacityLedger, CapacityShareError
from grid.agent.recovery import _same_process
from grid.agent.state import ProcessProof
from grid.cli.node import PidRecord, verify_pid
from grid.procstart import same_start, start_stamp
from grid.testfleet.fleet import stop_fleet
from grid.testfleet.procs import prove, spawn
from grid.testfleet.state import FleetSettings, FleetManifest, load_state, save_state

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="stamps are Linux's boot-relative start")

CORRECTION_SECONDS = 30.0


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def correct_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on psutil sees a boot time CORRECTION_SECONDS later, as after a clock step."""
    from psutil import _pslinux

    real = _pslinux.boot_time
    before = psutil.Process().create_time()
    monkeypatch.setattr(_pslinux, "boot_time", lambda: real() + CORRECTION_SECONDS)
    moved = psutil.Process().create_time() - before
    assert moved == pytest.approx(CORRECTION_SECONDS, abs=0.01), "the simulated correction did not take effect"


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_stamp_names_one_start_of_one_process(sleeper: subprocess.Popen[bytes]) -> None:
    mine, theirs = start_stamp(os.getpid()), start_stamp(sleeper.pid)
    assert mine is not None and theirs is not None
    assert mine != theirs
    assert start_stamp(sleeper.pid) == theirs
    assert theirs.startswith(_boot_id() + ":")
    sleeper.kill()
    sleeper.wait()
    assert start_stamp(sleeper.pid) is None


def test_a_correction_moves_create_time_but_not_the_stamp(sleeper: subprocess.Popen[bytes],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    created, stamp = psutil.Process(sleeper.pid).create_time(), start_stamp(sleeper.pid)
    correct_clock(monkeypatch)
    now = psutil.Process(sleeper.pid).create_time()
    assert same_start(sleeper.pid, now, recorded_stamp=stamp, recorded_create_time=created, tolerance=0.05)
    # A record from before stamps has only create_time, and that has moved.
    assert not same_start(sleeper.pid, now, recorded_stamp=None, recorded_create_time=created, tolerance=0.05)


def test_a_reused_pid_is_refused_even_when_create_time_matches(sleeper: subprocess.Popen[bytes]) -> None:
    created, stamp = psutil.Process(sleeper.pid).create_time(), start_stamp(sleeper.pid)
    assert stamp is not None
    another_start = f"{_boot_id()}:1"
    another_boot = "00000000-0000-0000-0000-000000000000:" + stamp.split(":")[1]
    for recorded in (another_start, another_boot):
        assert not same_start(sleeper.pid, created, recorded_stamp=recorded, recorded_create_time=created,
                              tolerance=0.05)


def test_the_test_fleet_still_stops_its_processes_after_a_correction(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen on a virtual machine: `gridctl test stop` left nats-server and the controller running
    because their recorded create_time no longer matched."""
    record = spawn([sys.executable, "-c", "import time; time.sleep(60)"], env=os.environ, log=tmp_path / "p.log")
    proc = prove(record)
    assert proc is not None
    try:
        settings = FleetSettings(machines=1, model_id="m.gguf", artifact_sha256="0" * 64, model_memory_mb=512,
                                 capacities_mb=(1024,), netns=False)
        save_state(FleetManifest(settings=settings, root=str(tmp_path), control_home=str(tmp_path / "control"),
                              controller=record))
        correct_clock(monkeypatch)
        assert stop_fleet(tmp_path) == []
        assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
        assert load_state(tmp_path) is None
    finally:
        if proc.is_running():
            proc.kill()


def test_an_engine_proof_survives_a_correction(sleeper: subprocess.Popen[bytes],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    proof = llama_cpp.capture_proof(sleeper.pid, port=1)
    assert proof.start_stamp is not None
    legacy = ProcessProof(pid=proof.pid, port=1, exe=proof.exe, cmdline=proof.cmdline, create_time=proof.create_time)
    correct_clock(monkeypatch)
    assert llama_cpp.prove(proof) == llama_cpp.PROOF_MATCH
    assert llama_cpp.prove(legacy) == llama_cpp.PROOF_GONE  # what an agent concluded before stamps
    # A restarted agent's scan of its live engines is recognised as the recorded one.
    rescanned = llama_cpp.capture_proof(sleeper.pid, port=1)
    assert _same_process(proof, rescanned)
    assert not _same_process(legacy, ProcessProof(pid=rescanned.pid, port=1, create_time=rescanned.create_time))


def test_the_agent_pid_record_survives_a_correction(sleeper: subprocess.Popen[bytes],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    proc = psutil.Process(sleeper.pid)
    record = PidRecord(pid=proc.pid, create_time=proc.create_time(), cmdline=tuple(proc.cmdline()), instance="i",
                       start_stamp=start_stamp(proc.pid))
    correct_clock(monkeypatch)
    assert verify_pid(record) == "running"
    assert verify_pid(PidRecord(pid=record.pid, create_time=record.create_time, cmdline=record.cmdline,
                                instance="i")) == "reused"


def test_capacity_claims_survive_a_correction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = CapacityLedger(tmp_path)
    mine.claim("laptop", 3000, total_mb=4000)
    correct_clock(monkeypatch)
    # Another agent on the machine still sees this live agent's share, so the two never add up
    # to more than the machine has.
    with pytest.raises(CapacityShareError):
        CapacityLedger(tmp_path).claim("laptop2", 2000, total_mb=4000)
    mine.release()
