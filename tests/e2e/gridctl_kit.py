"""Real `gridctl` processes for e2e tests: a `gridctl up` grid in a subprocess with its own grid
home, machines joined to it with an invitation (each with a home of its own, as a second
computer would have), their `gridctl node start` agents, and the status they show.

Each machine is a separate GRID_HOME: nothing is shared with the controller but the join token.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from tests.ports import engine_ports_arg

GRIDCTL = [sys.executable, "-m", "grid.cli.main"]

T = TypeVar("T")


def gridctl(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GRIDCTL, *args], env=env, capture_output=True, text=True, timeout=timeout)


def grid_env(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment for a machine whose grid home is `home`: nothing that would
    point it at another machine's grid (GRID_NATS_URL, GRID_AGENT_STATE_DIR) is inherited."""
    env = {**os.environ, "GRID_HOME": str(home), "COLUMNS": "200", **extra}
    env.pop("GRID_NATS_URL", None)
    env.pop("GRID_AGENT_STATE_DIR", None)
    return env


def wait_for_text(path: Path, text: str, proc: subprocess.Popen[bytes], timeout: float) -> str:
    """The content of `path` (a process's log) once it contains `text`; fails with the log's tail
    when the deadline passes or the process exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = path.read_text()
        if text in content or proc.poll() is not None:
            break
        time.sleep(0.3)
    content = path.read_text()
    assert text in content, content[-3000:]
    return content


def wait_until(probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.3) -> T:
    """The first truthy value `probe` returns within `timeout` seconds, else a failure naming
    `what` (and the last value seen)."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what} within {timeout:g}s; last seen: {last!r}")


def status_hosts(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """`gridctl status --json`'s host rows by host id."""
    out = gridctl(env, "status", "--json")
    assert out.returncode == 0, out.stderr
    return {h["host_id"]: h for h in json.loads(out.stdout)["hosts"]}


def stop(proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """SIGTERM (an agent drains and stops its children), then SIGKILL past `timeout`."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def gridctl_up(home: Path, log: Path, bundled_model_home: Path) -> Iterator[dict[str, str]]:
    """A `gridctl up` grid (embedded secured nats-server, controller, gateway, its own host) in
    observe mode, so it plans but starts no engine; yields the controller machine's environment
    once it says "grid is up", and takes it down (`gridctl down`) on the way out."""
    home.mkdir()
    # The bundled model is already verified in the session's cache: `up` finds it there.
    (home / "artifacts").symlink_to(bundled_model_home / "artifacts")
    env = grid_env(home)
    with open(log, "w") as out:
        up = subprocess.Popen([*GRIDCTL, "up", "--port", "0", "--mode", "observe", "--no-wait"], env=env,
                              stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_for_text(log, "grid is up", up, 120)
        yield env
    finally:
        gridctl(env, "down", timeout=120)
        stop(up)


def invite(controller_env: dict[str, str], host_id: str, *flags: str) -> str:
    """A join token for `host_id` (`gridctl invite`, with `flags` such as --dedicated)."""
    invited = gridctl(controller_env, "invite", "--host-id", host_id, "--ttl", "10m", *flags, "--json")
    assert invited.returncode == 0, invited.stderr
    return str(json.loads(invited.stdout)["token"])


def join(node_env: dict[str, str], token: str) -> None:
    joined = gridctl(node_env, "node", "join", token)
    assert joined.returncode == 0, joined.stderr


def start_agent(node_env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    """`gridctl node start` on a joined machine (fast heartbeats, this test's engine ports, JSON
    logs to `log`); returns without waiting (see wait_for_text "agent <id> running")."""
    with open(log, "w") as out:
        return subprocess.Popen([*GRIDCTL, "node", "start", "--heartbeat-interval", "0.5",
                                 "--port-range", engine_ports_arg(), "--log-format", "json", *args],
                                env=node_env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
