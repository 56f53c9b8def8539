"""A heartbeat's fold by fleet size: this tree against a baseline revision, in the same run.

Folds a heartbeat into every projection a controller tick reads (grid.controller.tick.PROJECTIONS:
fleet, lifecycle, and those that ignore heartbeats), in memory: no log, no decoding, no signature,
only `ProjectionRunner.fold_event`. A fleet of N hosts is folded in once, then heartbeats go round
the fleet, each host's every 5 s of log time (a steady fleet), and the best of `--rounds` timings
is reported per heartbeat.

The baseline is the `grid` package at `--baseline` (a git revision, `main` by default), taken with
`git archive` into a temporary directory; both trees are measured in their own interpreter, one
after the other at each size, with this file's measuring code.

With `--wave`, also a wave of commands and their acks (`measure_wave`): what the actions and
placed folds do per command and per ack with thousands of commands open.

    python -m bench.fold_scale [--hosts 1000,10000] [--heartbeats 1000] [--rounds 11] [--baseline main] [--wave]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
T0 = 1_800_000_000.0
HEARTBEAT_SECONDS = 5.0  # an agent's heartbeat interval


def measure(hosts: int, heartbeats: int, rounds: int) -> dict[str, float]:
    """Microseconds per heartbeat folded into the tick's projections, with `hosts` hosts known."""
    from bench._common import heartbeat
    from grid.controller.tick import PROJECTIONS
    from grid.events.subjects import HOSTS_STREAM
    from grid.projections.position import Position
    from grid.projections.runner import ProjectionRunner

    runner = ProjectionRunner(PROJECTIONS)
    seq = 0

    def fold(count: int) -> float:
        nonlocal seq
        events = [heartbeat(seq + i, hosts) for i in range(count)]
        # Received as a fleet heartbeating every HEARTBEAT_SECONDS would be: a steady fleet, not
        # hosts coming back from a silence (which the lifecycle fold counts as transitions).
        positions = [Position(HOSTS_STREAM, seq + i + 1, T0 + (seq + i) * HEARTBEAT_SECONDS / hosts)
                     for i in range(count)]
        t0 = time.perf_counter()
        for event, position in zip(events, positions):
            runner.fold_event(event, position)
        seconds = time.perf_counter() - t0
        seq += count
        return seconds

    fold(hosts)  # the fleet, each host once
    assert len(runner.states["fleet"].hosts) == hosts
    best = min(fold(heartbeats) for _ in range(rounds))
    import grid

    return {"hosts": hosts, "us_per_heartbeat": best / heartbeats * 1e6, "grid": str(Path(grid.__file__).parent)}


def measure_wave(hosts: int, rounds: int) -> dict[str, float]:
    """Microseconds per command and per ack folded into the tick's projections during a wave: a
    fleet of `hosts` known, a load and a warm commanded on every second host (the first wave of
    bench.controller_tick), each acknowledged accepted then succeeded. Each round folds a fresh
    wave into a fresh runner holding the same fleet; the best round is reported."""
    from bench._common import heartbeat
    from grid.controller.tick import PROJECTIONS
    from grid.events.acks import ActionAck
    from grid.events.commands import CommandIssued
    from grid.events.subjects import COMMANDS_STREAM, HOSTS_STREAM
    from grid.projections.actions import MAX_TERMINAL_ACTIONS
    from grid.projections.position import Position
    from grid.projections.runner import ProjectionRunner

    targets = [f"host-{i:04d}" for i in range(0, hosts, 2)]  # bench._common.heartbeat's host ids
    commands = [CommandIssued(event_id=f"{kind}-{h}", at=T0, action_id=f"{kind}-{h}", kind=kind, host_id=h,
                              model_id=f"model-{i % 32:02d}", memory_mb=6000, generation="g", controller_term=1,
                              controller_id="bench", lease_expires_at=T0 + 60, lease_ttl_seconds=60.0)
                for kind in ("load", "warm") for i, h in enumerate(targets)]
    acks = [ActionAck(event_id=f"ack-{status}-{c.action_id}", at=T0, host_id=c.host_id, action_id=c.action_id,
                      status=status, kind=c.kind, model_id=c.model_id, duration_seconds=3.0)
            for c in commands for status in ("accepted", "succeeded")]
    fleet = [heartbeat(i, hosts) for i in range(hosts)]
    best_cmd = best_ack = float("inf")
    for _ in range(rounds):
        runner = ProjectionRunner(PROJECTIONS)
        for i, event in enumerate(fleet):
            runner.fold_event(event, Position(HOSTS_STREAM, i + 1, T0))
        t0 = time.perf_counter()
        for i, event in enumerate(commands):
            runner.fold_event(event, Position(COMMANDS_STREAM, i + 1, T0 + 1))
        t1 = time.perf_counter()
        for i, event in enumerate(acks):
            runner.fold_event(event, Position(HOSTS_STREAM, hosts + i + 1, T0 + 2))
        t2 = time.perf_counter()
        best_cmd, best_ack = min(best_cmd, t1 - t0), min(best_ack, t2 - t1)
    # Every command finished: the actions fold keeps the latest MAX_TERMINAL_ACTIONS of them.
    assert len(runner.states["actions"].actions) == min(len(commands), MAX_TERMINAL_ACTIONS)
    import grid

    return {"hosts": hosts, "us_per_command": best_cmd / len(commands) * 1e6,
            "us_per_ack": best_ack / len(acks) * 1e6, "grid": str(Path(grid.__file__).parent)}


def _baseline_tree(revision: str, into: Path) -> Path:
    """The `grid` package as of `revision`, extracted under `into`."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", revision, "grid"],
                             check=True, capture_output=True).stdout
    tar = into / "grid.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as t:
        t.extractall(into, filter="data")
    return into


def _child(tree: Path, call: str) -> dict[str, float]:
    """Runs `call` (a measure function of this file) in a fresh interpreter importing `grid` from
    `tree` (and bench from here)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(tree), str(REPO))))
    out = subprocess.run(
        [sys.executable, "-c", "import json, sys; from bench.fold_scale import measure, measure_wave; "
                               f"print(json.dumps({call}))"],
        cwd=tree, env=env, check=True, capture_output=True, text=True,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    if Path(result["grid"]).resolve() != (tree / "grid").resolve():
        raise RuntimeError(f"measured the grid package at {result['grid']}, not the one in {tree}")
    return result


def main(sizes: list[int], heartbeats: int, rounds: int, revision: str, wave: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="grid-fold-baseline-") as d:
        base = _baseline_tree(revision, Path(d))
        print(f"fold per heartbeat into the tick's projections (best of {rounds} x {heartbeats:,} heartbeats)")
        for hosts in sizes:
            call = f"measure({hosts}, {heartbeats}, {rounds})"
            before = _child(base, call)["us_per_heartbeat"]
            after = _child(REPO, call)["us_per_heartbeat"]
            print(f"{hosts:>7,} hosts  baseline ({revision}) {before:8.1f} us  this tree {after:6.1f} us  "
                  f"ratio {before / after:6.1f}x")
        if not wave:
            return
        wave_rounds = max(1, rounds // 4)
        print(f"fold per command and per ack of a wave (a load and a warm on every second host, each acked "
              f"accepted then succeeded; best of {wave_rounds})")
        for hosts in sizes:
            call = f"measure_wave({hosts}, {wave_rounds})"
            b, a = _child(base, call), _child(REPO, call)
            for what in ("command", "ack"):
                key = f"us_per_{what}"
                print(f"{hosts:>7,} hosts  {what:<7} baseline ({revision}) {b[key]:8.1f} us  this tree "
                      f"{a[key]:6.1f} us  ratio {b[key] / a[key]:6.1f}x")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--hosts", default="1000,10000", help="comma-separated fleet sizes")
    p.add_argument("--heartbeats", type=int, default=1000, help="heartbeats timed per round")
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--baseline", default="main", help="git revision whose grid package is the baseline")
    p.add_argument("--wave", action="store_true", help="also fold a wave of commands and acks (measure_wave)")
    a = p.parse_args()
    main([int(h) for h in a.hosts.split(",")], a.heartbeats, a.rounds, a.baseline, a.wave)
