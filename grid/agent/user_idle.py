"""How long ago the person at this machine last touched it, in seconds. Unknown is None.

The protection loop yields to an active user, so a wrong "idle" would take the machine from its
owner while they work: every source here answers None rather than guess, and a source that
cannot see this machine's own keyboard and pointer is not asked at all.

Sources (each run only on the OS it belongs to):

* X11: the XScreenSaver extension's idle time (milliseconds since the server last saw input),
  read with python-xlib from the display `DISPLAY` names, when that display is local (":0",
  "unix:0"; a forwarded "host:10" shows the remote user's input) and the session is not Wayland
  (XWayland sees only input sent to X clients, so it would report a typing user as idle);
* macOS: `ioreg -c IOHIDSystem`, whose `"HIDIdleTime" = N` property line is in nanoseconds;
* Windows: `WINDOWS_IDLE_COMMAND`, a PowerShell one-liner that prints one integer, the
  milliseconds since the last input event (`[Environment]::TickCount` minus GetLastInputInfo's
  `dwTime`, both 32-bit tick counts, so the difference is taken modulo 2**32 and survives the
  49.7-day wrap), or -1 when GetLastInputInfo fails. It sees the input of the session it runs in:
  an agent run as a service (session 0) must not use it;
* terminals: the access time of each logged-in user's tty (what `w` shows), on every OS.

The parsers are pure functions of the tools' text; `UserIdle.read` combines the sources that
answered by taking the smallest idle time, because the most recent input anywhere is when the
user was last active.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Iterable, Mapping

import psutil

from grid.agent.inventory import Runner, run_tool

IOREG_IDLE_COMMAND = ("ioreg", "-c", "IOHIDSystem")

_WINDOWS_IDLE_SCRIPT = (
    "Add-Type -TypeDefinition 'using System; using System.Runtime.InteropServices; "
    "public static class GridIdle { "
    "[StructLayout(LayoutKind.Sequential)] public struct LASTINPUTINFO { public uint cbSize; public uint dwTime; } "
    "[DllImport(\"user32.dll\")] static extern bool GetLastInputInfo(ref LASTINPUTINFO info); "
    "public static long Milliseconds() { LASTINPUTINFO info = new LASTINPUTINFO(); "
    "info.cbSize = (uint)Marshal.SizeOf(info); if (!GetLastInputInfo(ref info)) { return -1; } "
    "return unchecked((uint)Environment.TickCount - info.dwTime); } }'; [GridIdle]::Milliseconds()"
)
WINDOWS_IDLE_COMMAND = ("powershell", "-NoProfile", "-NonInteractive", "-Command", _WINDOWS_IDLE_SCRIPT)

# A whole day without input is already "idle" for any policy; a larger figure from a parser is
# more likely garbage (a wrapped counter, a misread field) than a real reading.
MAX_PLAUSIBLE_IDLE_SECONDS = 400 * 24 * 3600.0

_HID_IDLE = re.compile(r'"HIDIdleTime"\s*=\s*(\d+)\s*$', re.MULTILINE)
_LOCAL_DISPLAY = re.compile(r"^(?:unix)?:(\d+)(?:\.\d+)?$")


def _plausible(seconds: float) -> float | None:
    return seconds if 0.0 <= seconds <= MAX_PLAUSIBLE_IDLE_SECONDS else None


def parse_ioreg_idle(text: str) -> float | None:
    """Seconds idle from `ioreg -c IOHIDSystem` output: the smallest `"HIDIdleTime" = N`
    (nanoseconds; a Mac lists one IOHIDSystem, the smallest is the safe pick if it ever lists
    more). None when the output has no such line."""
    values = [int(m.group(1)) for m in _HID_IDLE.finditer(text or "")]
    return _plausible(min(values) / 1e9) if values else None


def parse_windows_idle(text: str) -> float | None:
    """Seconds idle from `WINDOWS_IDLE_COMMAND`'s output: exactly one integer line of
    milliseconds (PowerShell ends it with CRLF). -1 (GetLastInputInfo failed), anything else or
    nothing: None."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if len(lines) != 1 or not re.fullmatch(r"-?\d+", lines[0]):
        return None
    milliseconds = int(lines[0])
    return _plausible(milliseconds / 1000.0) if milliseconds >= 0 else None


def local_x11_display(environ: Mapping[str, str]) -> str | None:
    """The X display whose idle time is this machine's user's, from the environment: DISPLAY
    when it names a local display and the session is not Wayland, else None."""
    name = environ.get("DISPLAY", "")
    if not _LOCAL_DISPLAY.match(name):
        return None
    if environ.get("WAYLAND_DISPLAY") or environ.get("XDG_SESSION_TYPE", "").lower() == "wayland":
        return None
    return name


def x11_idle_seconds(display_name: str) -> float | None:
    """Seconds since the X server at `display_name` last saw keyboard or pointer input, through
    the XScreenSaver extension. None when the display cannot be opened or lacks the extension."""
    from Xlib import display as xdisplay
    from Xlib import error as xerror

    try:
        conn = xdisplay.Display(display_name)
    except (xerror.DisplayError, xerror.XauthError, xerror.XNoAuthError, xerror.ConnectionClosedError, OSError):
        return None  # no server there, or one that refuses this user
    try:
        if not conn.has_extension("MIT-SCREEN-SAVER"):
            return None
        info = conn.screen().root.screensaver_query_info()
        return _plausible(info.idle / 1000.0)
    except (xerror.XError, xerror.ConnectionClosedError, OSError):
        return None
    finally:
        try:
            conn.close()
        except (xerror.XError, xerror.ConnectionClosedError, OSError):
            pass


def tty_idle_seconds(now: float) -> float | None:
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


def most_recent_input(idles: Iterable[float | None]) -> float | None:
    """The smallest known idle time (input seen anywhere is input), None if no source knew."""
    known = [idle for idle in idles if idle is not None]
    return min(known) if known else None


class UserIdle:
    """Reads every idle source this machine has. `system` is `platform.system()`'s answer;
    `x11_display` the display to ask (default: `local_x11_display` of this process's
    environment); `run` runs the macOS and Windows tools."""

    def __init__(self, *, system: str | None = None, x11_display: str | None = None,
                 environ: Mapping[str, str] | None = None, run: Runner = run_tool) -> None:
        self.system = platform.system() if system is None else system
        self.x11_display = x11_display if x11_display is not None else local_x11_display(
            os.environ if environ is None else environ)
        self._run = run

    def graphical_idle_seconds(self) -> float | None:
        """The graphical session's idle time on this OS, None when there is none to read."""
        if self.system == "Darwin":
            text = self._run(IOREG_IDLE_COMMAND)
            return None if text is None else parse_ioreg_idle(text)
        if self.system == "Windows":
            text = self._run(WINDOWS_IDLE_COMMAND)
            return None if text is None else parse_windows_idle(text)
        if self.x11_display is not None:
            return x11_idle_seconds(self.x11_display)
        return None

    def read(self, now: float) -> float | None:
        """Seconds since the user's most recent input on any source; `now` is wall-clock time
        (tty access times are wall-clock)."""
        return most_recent_input((self.graphical_idle_seconds(), tty_idle_seconds(now)))
