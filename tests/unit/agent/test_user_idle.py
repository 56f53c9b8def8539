"""The user's idle time: the macOS and Windows readers on recorded tool output (this machine runs
neither), which display counts as this machine's own, the terminal fallback, and how the sources
combine. The X11 reader runs against a real Xvfb in tests/integration/agent/test_x11_user_idle.py."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grid.agent import user_idle
from grid.agent.user_idle import (
    IOREG_IDLE_COMMAND,
    WINDOWS_IDLE_COMMAND,
    UserIdle,
    local_x11_display,
    most_recent_input,
    parse_ioreg_idle,
    parse_windows_idle,
)

READINGS = Path(__file__).parent / "readings"


def reading(name: str) -> str:
    return (READINGS / name).read_text()


def test_ioreg_idle_is_nanoseconds_of_the_property_line() -> None:
    assert parse_ioreg_idle(reading("ioreg-iohidsystem-m2.txt")) == pytest.approx(8.123456789)


def test_ioreg_without_the_property_is_unknown() -> None:
    assert parse_ioreg_idle(reading("ioreg-iohidsystem-truncated.txt")) is None
    assert parse_ioreg_idle("") is None
    # A value that is not a whole number, or the key inside a nested dictionary, is not a reading.
    assert parse_ioreg_idle('    |   "HIDIdleTime" = <garbled>\n') is None
    assert parse_ioreg_idle('    |   "HIDParameters" = {"HIDIdleTime"=5,"HIDClickTime"=500}\n') is None


def test_ioreg_takes_the_most_recent_of_several_entries() -> None:
    text = '  |   "HIDIdleTime" = 90000000000\n  |   "HIDIdleTime" = 2000000000\n'
    assert parse_ioreg_idle(text) == pytest.approx(2.0)


def test_windows_idle_is_one_line_of_milliseconds() -> None:
    assert parse_windows_idle(reading("windows-idle-ms.txt")) == pytest.approx(15.234)
    assert parse_windows_idle("0\r\n") == 0.0


@pytest.mark.parametrize("text", [
    reading("windows-idle-failed.txt"),  # GetLastInputInfo failed: -1
    reading("windows-idle-error.txt"),  # PowerShell's error record
    "",
    "15234\r\n16000\r\n",  # two answers: not the one-line format
    "15.2\r\n",
    "\x00\xff garbage",
    "99999999999999999999\r\n",  # beyond any plausible idle time
])
def test_windows_output_that_is_not_the_format_is_unknown(text: str) -> None:
    assert parse_windows_idle(text) is None


@given(st.text(max_size=200))
def test_parsers_never_raise_and_never_return_negative(text: str) -> None:
    for parse in (parse_ioreg_idle, parse_windows_idle):
        value = parse(text)
        assert value is None or value >= 0.0


def test_windows_command_measures_tick_count_against_last_input() -> None:
    script = WINDOWS_IDLE_COMMAND[-1]
    assert WINDOWS_IDLE_COMMAND[0] == "powershell" and "-NonInteractive" in WINDOWS_IDLE_COMMAND
    assert "GetLastInputInfo" in script
    assert "Environment.TickCount - info.dwTime" in script and "unchecked" in script


@pytest.mark.parametrize(("environ", "expected"), [
    ({"DISPLAY": ":0"}, ":0"),
    ({"DISPLAY": ":1.0"}, ":1.0"),
    ({"DISPLAY": "unix:2"}, "unix:2"),
    ({"DISPLAY": "localhost:10.0"}, None),  # ssh forwarding: the remote user's input
    ({"DISPLAY": "10.0.0.5:0"}, None),
    ({"DISPLAY": ":0", "WAYLAND_DISPLAY": "wayland-0"}, None),  # XWayland misses native input
    ({"DISPLAY": ":0", "XDG_SESSION_TYPE": "wayland"}, None),
    ({"DISPLAY": ":0", "XDG_SESSION_TYPE": "x11"}, ":0"),
    ({}, None),
    ({"DISPLAY": "garbage"}, None),
])
def test_only_a_local_x11_session_counts(environ: dict[str, str], expected: str | None) -> None:
    assert local_x11_display(environ) == expected


def test_most_recent_input_is_the_smallest_known_idle() -> None:
    assert most_recent_input([None, 30.0, 4.0]) == 4.0
    assert most_recent_input([None, None]) is None
    assert most_recent_input([]) is None


@given(st.lists(st.one_of(st.none(), st.floats(min_value=0.0, max_value=1e7)), max_size=5))
def test_an_unknown_source_never_makes_the_user_look_idler(idles: list[float | None]) -> None:
    combined = most_recent_input(idles)
    assert most_recent_input([*idles, None]) == combined
    known = [i for i in idles if i is not None]
    assert combined is None if not known else combined == min(known)


class Recorded:
    """The tools' recorded answers, by command; records what was run."""

    def __init__(self, answers: dict[tuple[str, ...], str | None]) -> None:
        self.answers = answers
        self.ran: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str]) -> str | None:
        self.ran.append(tuple(argv))
        return self.answers.get(tuple(argv))


def test_macos_and_windows_read_their_tool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(user_idle, "tty_idle_seconds", lambda now: None)
    mac = Recorded({IOREG_IDLE_COMMAND: reading("ioreg-iohidsystem-m2.txt")})
    assert UserIdle(system="Darwin", run=mac).read(time.time()) == pytest.approx(8.123456789)
    assert mac.ran == [IOREG_IDLE_COMMAND]
    windows = Recorded({WINDOWS_IDLE_COMMAND: reading("windows-idle-ms.txt")})
    assert UserIdle(system="Windows", run=windows).read(time.time()) == pytest.approx(15.234)
    # The tool missing or failing (run_tool's None) is unknown, not idle.
    assert UserIdle(system="Darwin", run=Recorded({})).read(time.time()) is None
    assert UserIdle(system="Windows", run=Recorded({})).read(time.time()) is None


def test_linux_without_a_display_runs_no_tool_and_knows_only_terminals(monkeypatch: pytest.MonkeyPatch) -> None:
    run = Recorded({})
    idle = UserIdle(system="Linux", environ={}, run=run)
    assert idle.x11_display is None and idle.graphical_idle_seconds() is None and run.ran == []
    monkeypatch.setattr(user_idle, "tty_idle_seconds", lambda now: 42.0)
    assert idle.read(time.time()) == 42.0


def test_the_smallest_idle_across_graphical_session_and_terminals_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    mac = Recorded({IOREG_IDLE_COMMAND: reading("ioreg-iohidsystem-m2.txt")})
    monkeypatch.setattr(user_idle, "tty_idle_seconds", lambda now: 3.0)  # typing in a terminal
    assert UserIdle(system="Darwin", run=mac).read(time.time()) == 3.0
    monkeypatch.setattr(user_idle, "tty_idle_seconds", lambda now: 600.0)
    assert UserIdle(system="Darwin", run=mac).read(time.time()) == pytest.approx(8.123456789)


def test_an_x11_display_nobody_serves_is_unknown(tmp_path: Path) -> None:
    # A local display number with no server socket: the connection fails, the reading is None.
    free = next(n for n in range(400, 500) if not os.path.exists(f"/tmp/.X11-unix/X{n}"))
    assert user_idle.x11_idle_seconds(f":{free}") is None
    assert UserIdle(system="Linux", x11_display=f":{free}").graphical_idle_seconds() is None


def test_tty_idle_is_unknown_or_non_negative() -> None:
    value = user_idle.tty_idle_seconds(time.time())
    assert value is None or value >= 0.0
