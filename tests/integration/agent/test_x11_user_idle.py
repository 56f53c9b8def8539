"""The user's idle time from a real X server: Xvfb on a display it chose, read through the
XScreenSaver extension by the same reader the agent's sensors use, and a pointer moved with
xdotool resets it. Nothing stands in for the server.

Xvfb and xdotool are Debian packages (pip cannot install them): `tests.x11_session` installs
them when missing and the suite runs as root, and otherwise fails saying what to install.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from grid.agent.sensors import PsutilSensors
from grid.agent.user_idle import UserIdle, local_x11_display, x11_idle_seconds
from tests.x11_session import Xvfb, move_pointer, require_x11_tools


@pytest.fixture
def xvfb() -> Iterator[Xvfb]:
    server = Xvfb(require_x11_tools())
    try:
        yield server
    finally:
        server.stop()


def test_pointer_motion_resets_x11_idle_time(xvfb: Xvfb) -> None:
    display = xvfb.display
    assert local_x11_display({"DISPLAY": display}) == display
    # The agent's sensors, pointed at this display the way DISPLAY would point them.
    sensors = PsutilSensors(user_idle=UserIdle(system="Linux", environ={"DISPLAY": display}))
    time.sleep(1.5)  # no input since the server started
    before = x11_idle_seconds(display)
    assert before is not None and before >= 1.0, before
    move_pointer(display, 100, 100)
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
