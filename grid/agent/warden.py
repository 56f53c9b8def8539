"""The engines' warden: the engines of an agent that died are adopted or stopped within a bound.

Engines run in their own session so that they outlive an agent crash: an agent started again on
the same state directory adopts them, warm, instead of loading its models anew
(grid.agent.recovery). Nothing stopped them when no agent came back: an agent killed with -9
left every engine running (some 230 MB each with the bundled model, and its port) until someone
stopped it by hand.

The warden is one small process per state directory, started by the agent with its first
engine (and after recovery when engines were kept). While an agent holds the directory's lock
(grid.agent.lock, dropped by the kernel when that process dies) it only watches. Once no agent
has held the lock for the grace, it stops every engine carrying the directory's owner token
(grid.agent.ownership), each through the same proven stop as the agent's own
(llama_cpp.stop_process), and exits. With no agent and no engine left, as after a graceful
stop, it exits at once. An agent that comes back within the grace finds its engines running and
adopts them; the warden keeps watching for it.

Why not PR_SET_PDEATHSIG on the engines, as the embedded nats-server has (grid.transport.embedded)?
It would kill every engine the moment its agent dies, and with them the adoption that a restart
by a supervisor, or by hand, gets today.

Run as `python -m grid.agent.warden --state-dir DIR --grace SECONDS`, with the owner token in
its environment (TOKEN_ENV): it is never in argv, where every user of the machine could read it.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from grid.agent.engines import llama_cpp
from grid.agent.lock import held, is_locked
from grid.agent.ownership import OwnedEngine, find_owned_engines
from grid.agent.state import AgentPaths
from grid.fleet.freshness import HEARTBEAT_TIMEOUT_SECONDS
from grid.secrets import CHILD_UMASK, open_owner_only

WARDEN_MODULE = "grid.agent.warden"
LOCK_FILE = "warden.lock"
LOG_FILE = "warden.log"
# Not ownership.OWNER_ENV: the warden is no engine, and an agent stops any process carrying
# that variable whose command line it cannot serve.
TOKEN_ENV = "GRID_WARDEN_OWNER"

# How long engines wait for their agent to come back: as long as the controller takes to call a
# silent host stale and stop counting on it, so nothing the grid still counts on is stopped.
ORPHAN_GRACE_SECONDS = HEARTBEAT_TIMEOUT_SECONDS
POLL_SECONDS = 0.5
# How long a new warden waits for an old one that is just exiting to drop the lock.
TAKEOVER_SECONDS = 3.0

# ensure_warden outcomes.
WARDEN_RUNNING = "running"
WARDEN_STARTED = "started"
WARDEN_START_FAILED = "start_failed"

# watch outcomes.
NOTHING_LEFT = "nothing_left"  # no agent holds the directory and no engine carries its token
ORPHANS_STOPPED = "orphans_stopped"  # the grace ran out: every engine left was stopped
AGENT_BACK = "agent_back"  # an agent took the directory while the orphans were being stopped

log = structlog.get_logger("grid.agent.warden")


@dataclass(frozen=True)
class WardenStart:
    outcome: str  # one of the ensure_warden outcomes above
    detail: str = ""


def lock_file(state_dir: Path) -> Path:
    return Path(state_dir) / LOCK_FILE


def ensure_warden(paths: AgentPaths, token: str, grace: float) -> WardenStart:
    """Start the warden of `paths` unless one runs already (blocking; run in a thread)."""
    if held(lock_file(paths.root)):
        return WardenStart(WARDEN_RUNNING)
    argv = [sys.executable, "-m", WARDEN_MODULE, "--state-dir", str(paths.root), "--grace", f"{grace:g}"]
    try:
        with open_owner_only(paths.logs / LOG_FILE, "ab") as out:
            # Its own session, as the engines have: a signal to the agent's process group (a
            # terminal's Ctrl-C, a supervisor killing the group) must not take the warden along.
            # The Popen handle is not kept: the warden ends on its own, and an exited child is
            # reaped by the subprocess module.
            subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                             env={**llama_cpp.child_env(), TOKEN_ENV: token}, start_new_session=True,
                             close_fds=True, umask=CHILD_UMASK)
    except OSError as exc:
        return WardenStart(WARDEN_START_FAILED, f"{type(exc).__name__}: {exc}")
    return WardenStart(WARDEN_STARTED)


def watch(state_dir: Path, token: str, grace: float, *, poll: float = POLL_SECONDS,
          monotonic: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> str:
    """Watch until nothing is left to watch; the outcome (blocking)."""
    absent_since: float | None = None
    while True:
        if is_locked(state_dir):
            absent_since = None
        else:
            engines = find_owned_engines(token)
            if not engines:
                return NOTHING_LEFT
            now = monotonic()
            if absent_since is None:
                absent_since = now
                log.info("warden.agent_gone", state_dir=str(state_dir), engines=len(engines), grace=grace)
            if now - absent_since >= grace:
                return stop_orphans(state_dir, engines)
        sleep(poll)


def stop_orphans(state_dir: Path, engines: list[OwnedEngine]) -> str:
    for engine in engines:
        if is_locked(state_dir):
            return AGENT_BACK  # it adopts or stops the rest itself
        result = llama_cpp.stop_process(engine.proof)
        log.info("warden.stopped_orphan", pid=engine.proof.pid, port=engine.proof.port,
                 model_id=engine.model_id, result=result)
    return ORPHANS_STOPPED


def take_lock(path: Path, wait_seconds: float) -> int | None:
    """An fd holding the exclusive flock on `path`, or None when another warden keeps it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            # Also what a momentary probe (ensure_warden's) looks like: try again for a while.
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.05)


def run(state_dir: Path, token: str, grace: float, *, poll: float = POLL_SECONDS) -> str:
    """Hold the warden lock of `state_dir` and watch; the last outcome, or WARDEN_RUNNING when
    another warden watches already."""
    fd = take_lock(lock_file(state_dir), TAKEOVER_SECONDS)
    if fd is None:
        return WARDEN_RUNNING
    while True:
        outcome = watch(state_dir, token, grace, poll=poll)
        log.info("warden.done", state_dir=str(state_dir), outcome=outcome)
        os.close(fd)  # drops the lock
        # An agent that started after the last look may have found this warden's lock held and
        # started none: look once more now that the lock is free, and stay if one did.
        if not is_locked(state_dir):
            return outcome
        fd = take_lock(lock_file(state_dir), 1.0)
        if fd is None:
            return outcome  # a new warden took over


def main(argv: list[str] | None = None) -> int:
    from grid.logs import configure_logging

    parser = argparse.ArgumentParser(prog=f"python -m {WARDEN_MODULE}",
                                     description="Stop a dead agent's engines when no agent comes back in time.")
    parser.add_argument("--state-dir", type=Path, required=True, help="the agent's state directory")
    parser.add_argument("--grace", type=float, default=ORPHAN_GRACE_SECONDS,
                        help="seconds the engines wait for an agent to come back")
    args = parser.parse_args(argv)
    configure_logging("json")
    token = os.environ.pop(TOKEN_ENV, "")
    if not token:
        log.error("warden.no_token", env=TOKEN_ENV)
        return 2
    run(args.state_dir, token, args.grace)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
