"""Local sensors behind one interface. Unknown is None, never zero.

`PsutilSensors` reads the real machine. `FixedSensors` is the injection seam for tests, the
scenario lab and `gridctl up` on a machine whose readings should be pinned: it returns whatever
sample it was last given.
"""

from __future__ import annotations

import os
import time
from typing import Protocol

import psutil

from grid.agent.protection import SensorSample


class SensorSource(Protocol):
    def read(self) -> SensorSample: ...


class FixedSensors:
    def __init__(self, sample: SensorSample | None = None) -> None:
        self.sample = sample or SensorSample()

    def set(self, sample: SensorSample) -> None:
        self.sample = sample

    def read(self) -> SensorSample:
        return self.sample


def _max_temperature() -> float | None:
    reader = getattr(psutil, "sensors_temperatures", None)
    if reader is None:
        return None
    try:
        groups = reader()
    except (OSError, RuntimeError):
        return None
    values = [
        float(entry.current)
        for entries in groups.values()
        for entry in entries
        if entry.current is not None and entry.current > -100
    ]
    return max(values) if values else None


def _user_idle_seconds(now: float) -> float | None:
    """Seconds since the most recent terminal input of any logged-in user (like `w`)."""
    try:
        users = psutil.users()
    except (OSError, RuntimeError):
        return None
    idles: list[float] = []
    for user in users:
        terminal = user.terminal
        if not terminal:
            continue
        try:
            atime = os.stat(os.path.join("/dev", terminal)).st_atime
        except OSError:
            continue
        idles.append(max(0.0, now - atime))
    return min(idles) if idles else None


class PsutilSensors:
    def __init__(self) -> None:
        psutil.cpu_percent(interval=None)  # prime: the first call has no interval to measure

    def read(self) -> SensorSample:
        cpu = psutil.cpu_percent(interval=None)
        memory = psutil.virtual_memory().percent
        battery_percent: float | None = None
        plugged: bool | None = None
        reader = getattr(psutil, "sensors_battery", None)
        if reader is not None:
            try:
                battery = reader()
            except (OSError, RuntimeError):
                battery = None
            if battery is not None:
                battery_percent = float(battery.percent)
                plugged = None if battery.power_plugged is None else bool(battery.power_plugged)
        return SensorSample(
            cpu_percent=float(cpu),
            memory_percent=float(memory),
            temperature_c=_max_temperature(),
            battery_percent=battery_percent,
            power_plugged=plugged,
            user_idle_seconds=_user_idle_seconds(time.time()),
        )
