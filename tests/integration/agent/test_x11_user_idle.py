"""The user's idle time from a real X server: Xvfb on a display it chose, read through the
XScreenSaver extension by the same reader the agent's sensors use, and a pointer moved with
xdotool resets it. Nothing stands in for the server.

Xvfb and xdotool are Debian packages (pip cannot install them): `tests.debian_packages` installs
them when missing and the suite runs as root, and otherwise fails saying what to install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from grid.agent.sensors import PsutilSensors
from grid.agent.user_idle import UserIdle, local_x11_display, x11_idle_seconds
from tests.debian_packages import require_debian_tool

X11_PACKAGES = ("xvfb", "xdotool")
MISSING = "the X11 idle test needs Xvfb and xdotool: `apt-get install xvfb xdotool`"


def _find_x11_tools() -> str | None:
    if shutil.which("Xvfb") and shutil.which("xdotool"):
        return shutil.which("Xvfb")
    return None


def _read_display_number(fd: int, deadline: float) -> str:
    """Xvfb's `-displayfd` answer: the display number it bound, then a newline."""
    os.set_blocking(fd, False)
    answer = b""
    while not answer.endswith(b"\n"):
        if time.monotonic() > deadline:
            raise TimeoutError("Xvfb did not report its display number")
        try:
            chunk = os.read(fd, 16)
        except BlockingIOError:
            time.sleep(0.02)
            continue
        if not chunk:
            raise RuntimeError("Xvfb exited before reporting its display number")
        answer += chunk
    return answer.decode().strip()


class Xvfb:
    """A fresh Xvfb: `-displayfd` lets the server pick a free display number itself (no race with
    another server for a number chosen here); unix socket only."""

    def __init__(self, executable: str) -> None:
        read_end, write_end = os.pipe()
        self.proc = subprocess.Popen(
            [executable, "-displayfd", str(write_end), "-nolisten", "tcp", "-screen", "0", "640x480x24"],
            pass_fds=(write_end,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(write_end)
        try:
            self.display = ":" + _read_display_number(read_end, time.monotonic() + 10.0)
        except BaseException:
            self.stop()
            raise
        finally:
            os.close(read_end)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def xvfb() -> Iterator[Xvfb]:
    server = Xvfb(require_debian_tool(_find_x11_tools, X11_PACKAGES, MISSING))
    try:
        yield server
    finally:
        server.stop()


def _move_pointer(display: str, x: int, y: int) -> None:
    subprocess.run(["xdotool", "mousemove", str(x), str(y)], env={**os.environ, "DISPLAY": display},
                   check=True, timeout=10, capture_output=True)


def test_pointer_motion_resets_x11_idle_time(xvfb: Xvfb) -> None:
    display = xvfb.display
    assert local_x11_display({"DISPLAY": display}) == display
    # The agent's sensors, pointed at this display the way DISPLAY would point them.
    sensors = PsutilSensors(user_idle=UserIdle(system="Linux", environ={"DISPLAY": display}))
    time.sleep(1.5)  # no input since the server started
    before = x11_idle_seconds(display)
    assert before is not None and before >= 1.0, before
    _move_pointer(display, 100, 100)
    after = x11_idle_seconds(display)
    assert after is not None and after < 0.5 < before, (before, after)
    # Through the whole sensor: the most recent input (terminals included) is at most that old.
    sample = sensors.read()
    assert sample.user_idle_seconds is not None and sample.user_idle_seconds < 1.0
    time.sleep(1.0)
    again = x11_idle_seconds(display)
    assert again is not None and again >= 0.9  # and it grows again without input


def test_a_stopped_x_server_reads_as_unknown(xvfb: Xvfb) -> None:
    reader = UserIdle(system="Linux", environ={"DISPLAY": xvfb.display})
    assert reader.graphical_idle_seconds() is not None
    xvfb.stop()
    # The user's session ended (or the server died): unknown, never "idle".
    assert reader.graphical_idle_seconds() is None
    assert x11_idle_seconds(xvfb.display) is None
