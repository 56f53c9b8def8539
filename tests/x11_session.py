"""A real X server for tests of the user's idle time: Xvfb on a display it chose itself, and
input given to it with xdotool (what a person at the keyboard would do). Nothing stands in for
the server.

Xvfb and xdotool are Debian packages (pip cannot install them): `require_x11_tools` installs
them when missing and the suite runs as root, and otherwise fails saying what to install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

from tests.debian_packages import require_debian_tool

X11_PACKAGES = ("xvfb", "xdotool")
MISSING = "the X11 idle tests need Xvfb and xdotool: `apt-get install xvfb xdotool`"


def _find_x11_tools() -> str | None:
    if shutil.which("Xvfb") and shutil.which("xdotool"):
        return shutil.which("Xvfb")
    return None


def require_x11_tools() -> str:
    """The Xvfb executable (xdotool is there too), installed first when missing and allowed."""
    return require_debian_tool(_find_x11_tools, X11_PACKAGES, MISSING)


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


def move_pointer(display: str, x: int, y: int) -> None:
    """Input on `display`, as a user's mouse would give it: the server's idle time restarts."""
    subprocess.run(["xdotool", "mousemove", str(x), str(y)], env={**os.environ, "DISPLAY": display},
                   check=True, timeout=10, capture_output=True)


def on_display(env: dict[str, str], display: str) -> dict[str, str]:
    """`env` for a process of the graphical session on `display`: DISPLAY names it, and no
    Wayland marker inherited from the machine running the tests hides it (the idle reader does
    not trust X11 under Wayland)."""
    env = {**env, "DISPLAY": display}
    env.pop("WAYLAND_DISPLAY", None)
    env.pop("XDG_SESSION_TYPE", None)
    return env
