"""A dedicated server ignores the person at the console while a laptop yields to its user.

The seed: "Use --dedicated only for an always-on server. Omit it on a workstation or laptop so
local activity ... can throttle". Here a real `gridctl up` grid invites two machines, one with
`gridctl invite --dedicated` (the server) and one without (the laptop), each joins with its own
grid home and runs `gridctl node start` with DISPLAY on one real Xvfb. A graphical session's
input (xdotool moving the pointer) stands in for someone logging in at the console and working:
both agents read the same X server's idle time through XScreenSaver.

Neither node is told a yield threshold: the laptop yields by its default (`--yield-to-user` unset ->
DEFAULT_YIELD_TO_USER_SECONDS, 300 s), the server by its enrolment never does. The laptop's
protection state becomes throttled with reason user_active (status, and its host.protection.v1
event, whose sensor reading shows it saw the pointer move rather than the server's start), the
server stays accepting under the same input, and `gridctl status` says which is which.

The grid runs in observe mode and no model is configured for the joined nodes' sake, so no
engine starts anywhere: the agents only sample, heartbeat and report.
"""

from __future__ import annotations

import json
import shutil
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from grid.agent.launch import DEFAULT_YIELD_TO_USER_SECONDS
from grid.agent.protection import REASON_USER_ACTIVE, ProtectionPolicy
from tests.e2e.gridctl_kit import (
    gridctl,
    gridctl_up,
    grid_env,
    invite,
    join,
    start_agent,
    status_hosts,
    stop,
    wait_for_text,
    wait_until,
)
from tests.x11_session import Xvfb, move_pointer, on_display, require_x11_tools

pytestmark = pytest.mark.e2e

SERVER, LAPTOP = "server-1", "laptop-1"
# Fast protection samples, so a three-sample debounce takes 1.5 s rather than the default 6 s.
SAMPLE_INTERVAL = 0.5
# CPU pressure is read for the whole machine, and a test session (`-n 2`, engines in the other
# worker) keeps a 2-core machine above the default 90 % for seconds at a time: the server would
# throttle for cpu_high, and the laptop would report cpu_high, which the checks list before
# user_active. Both nodes turn CPU throttling off so the user is the only pressure they weigh;
# every other default (the yield to the user above all) stays.
NODE_ARGS = ("--sample-interval", str(SAMPLE_INTERVAL), "--cpu-throttle", "0")
DEBOUNCE_SECONDS = ProtectionPolicy().debounce_samples * SAMPLE_INTERVAL


def _protection_events(controller_env: dict[str, str]) -> list[dict[str, Any]]:
    """Every host.protection.v1 event on the log, oldest first (`gridctl events export`)."""
    out = gridctl(controller_env, "events", "export", "--stream", "hosts")
    assert out.returncode == 0, out.stderr
    lines = (json.loads(line) for line in out.stdout.splitlines() if line.strip())
    return [line["event"] for line in lines if line["type"] == "host.protection.v1"]


def _status_line(text: str, host_id: str) -> str:
    return next(line for line in text.splitlines() if host_id in line)


def test_a_dedicated_server_ignores_the_console_while_a_laptop_yields_to_its_user(
    tmp_path: Path, bundled_model_home: Path
) -> None:
    homes = {SERVER: tmp_path / SERVER, LAPTOP: tmp_path / LAPTOP, "controller": tmp_path / "controller"}
    with ExitStack() as stack:  # unwinds in reverse: agents, the grid, the X server, the homes
        for home in homes.values():  # credentials and the NATS store go; the logs stay
            stack.callback(shutil.rmtree, home, ignore_errors=True)
        # The X server starts first, so its own start lies well before the input below: a reading
        # after the input that is shorter than the server's age can only come from that input.
        xvfb = Xvfb(require_x11_tools())
        stack.callback(xvfb.stop)
        xvfb_started = time.time()
        ctl = stack.enter_context(gridctl_up(homes["controller"], tmp_path / "up.log", bundled_model_home))
        envs = {host: on_display(grid_env(homes[host]), xvfb.display) for host in (SERVER, LAPTOP)}
        join(envs[SERVER], invite(ctl, SERVER, "--dedicated"))
        join(envs[LAPTOP], invite(ctl, LAPTOP))

        # Someone logs in at the console and starts working: one input on the shared display
        # before either agent runs, then more on every check below.
        first_input = time.time()
        move_pointer(xvfb.display, 10, 10)
        logs = {host: tmp_path / f"{host}.log" for host in envs}
        agents = {}
        for host in envs:
            agents[host] = start_agent(envs[host], logs[host], *NODE_ARGS)
            stack.callback(stop, agents[host])
        for host, agent in agents.items():
            wait_for_text(logs[host], f"agent {host} running", agent, 60)

        moves = iter(range(1_000_000))

        def working() -> None:
            n = next(moves)
            move_pointer(xvfb.display, 20 + n % 400, 20 + n % 300)

        def laptop_yielded() -> dict[str, dict[str, Any]] | None:
            working()
            hosts = status_hosts(ctl)
            laptop, server = hosts.get(LAPTOP), hosts.get(SERVER)
            if not (laptop and server and laptop["fresh"] and server["fresh"]):
                return None
            if (laptop["state"], laptop["protection_reason"]) != ("throttled", REASON_USER_ACTIVE):
                return None
            return hosts

        hosts = wait_until(laptop_yielded, 30, "the laptop throttled for its user in status")
        assert (hosts[SERVER]["state"], hosts[SERVER]["protection_reason"]) == ("accepting", ""), hosts[SERVER]

        # Under the same continuing input, the server keeps accepting for twice the laptop's
        # debounce (a negative is only seen over a window; its length is the agents' own).
        window_end = time.monotonic() + 2 * DEBOUNCE_SECONDS
        while time.monotonic() < window_end:
            working()
            server = status_hosts(ctl)[SERVER]
            assert server["fresh"] and server["state"] == "accepting", server

        # The laptop's transition, as its agent put it on the log, with the reading behind it.
        events = _protection_events(ctl)
        assert [e for e in events if e["host_id"] == SERVER] == [], "the dedicated server never left accepting"
        yielded = [e for e in events if e["host_id"] == LAPTOP and e["to_state"] == "throttled"]
        assert yielded, events
        transition = yielded[0]
        assert (transition["from_state"], transition["reason"]) == ("accepting", REASON_USER_ACTIVE)
        idle = transition["sensors"]["user_idle_seconds"]
        # The sample was taken after the first input (X11 counts whole milliseconds) ...
        assert idle is not None and idle <= transition["at"] - first_input + 0.01, (idle, transition)
        # ... so it is younger than the X server, whose own start the grid's start lies after.
        assert first_input - xvfb_started > 1.0 and idle < transition["at"] - xvfb_started

        # Status says which machine is which.
        assert (hosts[SERVER]["use"], hosts[SERVER]["yield_to_user_seconds"]) == ("dedicated", None)
        assert (hosts[LAPTOP]["use"], hosts[LAPTOP]["yield_to_user_seconds"]) == (
            "employee", DEFAULT_YIELD_TO_USER_SECONDS)
        table = gridctl(ctl, "status")
        assert table.returncode == 0, table.stderr
        server_line, laptop_line = _status_line(table.stdout, SERVER), _status_line(table.stdout, LAPTOP)
        assert "accepting" in server_line and "dedicated" in server_line, server_line
        assert "throttled: user_active" in laptop_line and "employee, yields 300s" in laptop_line, laptop_line

        print(f"\nX display {xvfb.display}; pointer moved {1 + next(moves)} times; "
              f"first input {first_input - xvfb_started:.1f}s after the X server started")
        print(f"{LAPTOP} protection event: {transition['from_state']} -> {transition['to_state']} "
              f"({transition['reason']}), user_idle_seconds={idle} "
              f"({transition['at'] - first_input:.1f}s after the first input)")
        print(f"{SERVER} protection events: none")
        print(server_line.rstrip())
        print(laptop_line.rstrip())
