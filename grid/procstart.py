"""Proving that a pid is still the process Grid recorded, by a start time the wall clock cannot move.

A pid alone proves nothing (the kernel reuses them), so every record of a process Grid started or
runs as (engines, the agent's pid file, capacity claims, `gridctl up`, the test fleet) keeps when
it started, and a later check compares. psutil's `create_time()` is the kernel's boot-relative
start plus the boot time *as the kernel reports it now* (`btime`: the wall clock minus the
uptime), so every wall-clock correction moves it: an NTP step or slew, a virtual machine paused
and resumed, a laptop's clock set after a suspend. Compared later with a tight tolerance it
fails for the very same process. On a virtual machine `btime` was seen to move 30 s within
minutes: the test fleet then no longer recognised its own nats-server and controller, and
`gridctl test stop` left them running.

`start_stamp` is this boot's id with the process's boot-relative start in clock ticks (Linux),
which only a reboot changes, and a reboot ends every process it could name. Records keep it
beside `create_time`; `same_start` compares stamps when both sides have one and falls back to
`create_time` within a tolerance otherwise (records written before stamps existed, and other
systems, whose kernels record a process's start as an absolute time that later corrections do
not rewrite).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

PROC = Path("/proc")
# create_time comes from clock ticks (10 ms) and is rounded: one start never differs by more,
# while a reused pid was born at another time (records without stamps only).
CREATE_TIME_TOLERANCE_SECONDS = 0.05
# Fields of /proc/<pid>/stat after the command name's closing parenthesis start at field 3;
# starttime is field 22 (proc(5)).
_STARTTIME_INDEX = 22 - 3


@functools.cache
def _boot_id() -> str | None:
    try:
        return (PROC / "sys" / "kernel" / "random" / "boot_id").read_text().strip() or None
    except OSError:
        return None


def start_stamp(pid: int) -> str | None:
    """`"<boot id>:<start ticks>"` for a live `pid` on Linux; None elsewhere, or when it is gone."""
    if not sys.platform.startswith("linux"):
        return None
    boot = _boot_id()
    if boot is None:
        return None
    try:
        stat = (PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields start after the last ")".
    fields = stat[stat.rfind(b")") + 1:].split()
    if len(fields) <= _STARTTIME_INDEX or not fields[_STARTTIME_INDEX].isdigit():
        return None
    return f"{boot}:{int(fields[_STARTTIME_INDEX])}"


def same_start(pid: int, create_time: float, *, recorded_stamp: str | None, recorded_create_time: float | None,
               tolerance: float) -> bool:
    """Whether the live process `pid`, whose psutil `create_time` is given, is the one recorded."""
    stamp = start_stamp(pid) if recorded_stamp is not None else None
    return starts_match(stamp, create_time, recorded_stamp, recorded_create_time, tolerance=tolerance)


def starts_match(stamp_a: str | None, create_time_a: float | None, stamp_b: str | None,
                 create_time_b: float | None, *, tolerance: float) -> bool:
    """Whether two records describe one start: the stamps decide when both exist; otherwise the
    create times, within `tolerance` seconds."""
    if stamp_a is not None and stamp_b is not None:
        return stamp_a == stamp_b
    if create_time_a is None or create_time_b is None:
        return False
    return abs(create_time_a - create_time_b) <= tolerance
