"""A real `gridctl node start` in its own process, for the fault tests that kill or damage it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def agent_env(home: Path) -> dict[str, str]:
    """The environment of an agent (or a `gridctl node` command) of the grid home `home`: the NATS
    URL comes from its arguments, never from the test runner's environment."""
    env = {**os.environ, "GRID_HOME": str(home)}
    env.pop("GRID_NATS_URL", None)
    return env


def spawn_agent(nats_url: str, home: Path, log_file: Path, *args: str) -> subprocess.Popen[bytes]:
    """`gridctl node start` on `nats_url` with fast heartbeats and samples, JSON logs appended to
    `log_file`, and `args` (host id, port range, grace)."""
    cmd = [sys.executable, "-m", "grid.cli.node", "start", "--nats", nats_url, "--heartbeat-interval", "0.5",
           "--sample-interval", "0.5", "--json-logs", *args]
    with open(log_file, "ab") as out:
        return subprocess.Popen(cmd, env=agent_env(home), stdout=out, stderr=subprocess.STDOUT)
