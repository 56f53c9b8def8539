"""Detached processes the fixture starts, and how it proves and stops exactly those.

A process is signalled only when its pid still has the recorded birth time and command line:
a pid the kernel reused for something else is left alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from grid.procstart import CREATE_TIME_TOLERANCE_SECONDS, same_start, start_stamp
from grid.testfleet.state import ProcessRecord

# How long a wrapper (`ip netns exec`) may take to exec the real command.
EXEC_TIMEOUT_SECONDS = 10.0


def spawn(argv: Sequence[str], *, env: Mapping[str, str], log: Path, runs: Sequence[str] | None = None) -> ProcessRecord:
    """Start `argv` in its own session (it outlives `gridctl test start`), output to `log`.

    `runs`: the command line the process ends up with when `argv` execs another program in
    place (`ip netns exec NS CMD` becomes CMD); the record holds that one, so later proofs match.
    """
    log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(log, "ab") as out:
        proc = subprocess.Popen(list(argv), env=dict(env), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    ps = psutil.Process(proc.pid)
    expected = tuple(runs if runs is not None else argv)
    deadline = time.monotonic() + EXEC_TIMEOUT_SECONDS
    cmdline: tuple[str, ...] = ()
    while time.monotonic() < deadline:
        try:
            cmdline = tuple(ps.cmdline())
        except psutil.Error:
            break  # it exited already: the caller's readiness check reports it with its log
        if cmdline == expected:
            break
        time.sleep(0.01)
    return ProcessRecord(pid=proc.pid, create_time=ps.create_time(), cmdline=cmdline, log=str(log),
                         start_stamp=start_stamp(proc.pid))


def prove(record: ProcessRecord | None) -> psutil.Process | None:
    """The live process `record` describes, or None (gone, a zombie, or the pid was reused)."""
    if record is None:
        return None
    try:
        proc = psutil.Process(record.pid)
        with proc.oneshot():
            if not same_start(proc.pid, proc.create_time(), recorded_stamp=record.start_stamp,
                              recorded_create_time=record.create_time, tolerance=CREATE_TIME_TOLERANCE_SECONDS):
                return None
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            if record.cmdline and tuple(proc.cmdline()) != tuple(record.cmdline):
                return None
    except psutil.Error:
        return None
    return proc


def alive(record: ProcessRecord | None) -> bool:
    return prove(record) is not None


def _running(proc: psutil.Process) -> bool:
    """Still running: a zombie has exited (its parent, maybe not us, has not collected it yet)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_exit(procs: Sequence[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until each has exited (zombies count: psutil.wait_procs would wait the whole timeout
    for a zombie whose parent is another process); returns those still running."""
    deadline = time.monotonic() + timeout
    remaining = [p for p in procs if _running(p)]
    while remaining and time.monotonic() < deadline:
        time.sleep(0.05)
        _reap(p.pid for p in remaining)
        remaining = [p for p in remaining if _running(p)]
    return remaining


def terminate(records: Sequence[ProcessRecord | None], *, timeout: float) -> list[int]:
    """SIGTERM each proven process, wait up to `timeout`, SIGKILL what remains. Returns the
    pids that had to be killed."""
    procs = [p for p in (prove(r) for r in records) if p is not None]
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    remaining = _wait_exit(procs, timeout)
    killed = []
    for p in remaining:
        try:
            p.kill()
            killed.append(p.pid)
        except psutil.Error:
            pass
    _wait_exit(remaining, 5.0)
    _reap(p.pid for p in procs)
    return killed


def kill_now(record: ProcessRecord | None) -> bool:
    """SIGKILL the proven process (a test's crash); False when it was not running."""
    proc = prove(record)
    if proc is None:
        return False
    proc.kill()
    _wait_exit([proc], 5.0)
    _reap([proc.pid])
    return True


def _reap(pids) -> None:  # type: ignore[no-untyped-def]
    """Collect our own exited children (a test process starts the fleet in-process), so
    they do not linger as zombies; pids that are not our children are ignored."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except (ChildProcessError, OSError):
            pass
