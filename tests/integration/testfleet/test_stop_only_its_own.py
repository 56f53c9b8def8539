"""`gridctl test stop` signals only processes it can prove it started (pid, birth time, command
line) and removes only network objects named with its prefix, whatever its state file says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil

from grid.testfleet.fleet import stop_fleet
from grid.testfleet.procs import spawn
from grid.testfleet.state import FleetSettings, FleetManifest, HostManifest, ProcessRecord, load_state, save_state

SETTINGS = FleetSettings(machines=1, model_id="m.gguf", artifact_sha256="0" * 64, model_memory_mb=512,
                         capacities_mb=(1024,), netns=False)


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_state_file_naming_foreign_processes_and_objects_harms_none(tmp_path: Path) -> None:
    foreign = _sleeper()
    try:
        proc = psutil.Process(foreign.pid)
        reused = ProcessRecord(pid=foreign.pid, create_time=proc.create_time() - 100.0,  # another birth: pid reuse
                               cmdline=tuple(proc.cmdline()), log="")
        other_cmd = ProcessRecord(pid=foreign.pid, create_time=proc.create_time(), cmdline=("nats-server",), log="")
        state = FleetManifest(settings=SETTINGS, root=str(tmp_path), control_home=str(tmp_path / "control"),
                           controller=reused, gateway=other_cmd, bridge="docker0",
                           hosts=[HostManifest(host_id="h1", failure_domain="fd1", capacity_mb=1024, port_range=(1, 2),
                                             home=str(tmp_path / "h1"), netns="someone-elses", veth="eth0",
                                             agent=reused)])
        save_state(state)
        problems = stop_fleet(tmp_path)
        assert foreign.poll() is None, "a process the fleet cannot prove it started was signalled"
        assert any("refused to remove 'docker0'" in p for p in problems), problems
        assert any("refused to remove 'eth0'" in p for p in problems), problems
        assert any("refused to remove 'someone-elses'" in p for p in problems), problems
        assert load_state(tmp_path) is not None  # kept: the stop was not clean
    finally:
        foreign.kill()
        foreign.wait()


def test_the_processes_it_started_are_stopped(tmp_path: Path) -> None:
    import os

    record = spawn([sys.executable, "-c", "import time; time.sleep(60)"], env=os.environ, log=tmp_path / "p.log")
    state = FleetManifest(settings=SETTINGS, root=str(tmp_path), control_home=str(tmp_path / "control"),
                       controller=record)
    save_state(state)
    assert stop_fleet(tmp_path) == []
    assert not psutil.pid_exists(record.pid) or psutil.Process(record.pid).status() == psutil.STATUS_ZOMBIE
    assert load_state(tmp_path) is None
