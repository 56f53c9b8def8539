"""Serving through faults: a steady chat load (one sequential client and eight concurrent ones,
real requests through the gateway to llama.cpp with the SmolLM2 GGUF, 4 tokens each) while one
fault happens, for each fault in one run.

On the README's scaled-out grid (3-node TLS NATS cluster in network namespaces, controller,
gateway, two agents that joined by invitation; bench._cluster_grid):
- baseline: no fault (the same load, the same window: what every fault is compared with);
- drain: `gridctl node drain` on the host of the model's only copy (the other host can hold it;
  the agent's drain deadline is 60 s);
- silent node: every packet to and from the NATS node the gateway is connected to dropped;
- host path killed: kill -9 of the NATS node a serving host's agent is connected to (not the
  gateway's), with a long stream in flight on that host; how long that stream took to end, and
  with which error, is in the row's note (goal: within 10 s, with a retryable error);
- agent SIGSTOP: the agent of one of two ready copies stopped for the window, then resumed
  (goal: at most one failed request);
- engine SIGSTOP: the engine (llama-server) of one of two ready copies stopped for the window,
  its agent left running (goal: the answers on it end within ~9 s as `engine_stalled`, and the
  gateway then asks the other copy; at most the requests in flight fail);
- agent kill -9: the agent of one of two ready copies, its engine left running.
On `gridctl up` (embedded NATS, one host):
- NATS kill -9 with requests in flight (the supervisor restarts it);
- disk full, then freed: the grid's home on a small tmpfs, filled by a file, which is then removed.

Per fault and client group: requests, failed, longest gap between successes, successes per second
against the baseline's (the ratio), and slots leaked (the gateway's `/gateway/stats` active must
return to 0 within 10 s of the load stopping). Goals: every slot released within 10 s; a silent
node or a dead agent costs at most 5 s of failures; the drain costs no request.

    python -m bench.serving_faults [--window 25] [--skip-up]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

from bench._cluster_grid import CACHE, GRIDCTL, MODEL, ClusterGrid, wait
from bench._common import ChatLoad, LoadWindow, slots_released

SLOT_BOUND_SECONDS = 10.0
GROUPS = (("sequential", 1), ("8 concurrent", 8))


class Row:
    def __init__(self, fault: str, windows: dict[str, LoadWindow], released: float | None, leaked: int,
                 note: str = "") -> None:
        self.fault, self.windows, self.released, self.leaked, self.note = fault, windows, released, leaked, note


def print_row(row: Row, baseline: Row | None) -> None:
    released = f"{row.released:.1f}s" if row.released is not None else f"NOT within {SLOT_BOUND_SECONDS:.0f}s"
    print(f"{row.fault}: slots released after {released}, leaked {row.leaked}{'; ' + row.note if row.note else ''}")
    for group, w in row.windows.items():
        ratio = ""
        if baseline is not None and baseline.windows[group].success_rate:
            ratio = f", success rate {w.success_rate / baseline.windows[group].success_rate:.2f}x baseline"
        print(f"  {group:>12}: {w.sent} requests, {w.failed} failed {w.statuses or ''}, "
              f"longest gap between successes {w.longest_gap:.1f}s{ratio}", flush=True)


async def under_load(gateway_url: str, fault: Callable[[], str | None], *, window: float,
                     settle: float = 5.0) -> tuple[dict[str, LoadWindow], float | None, int, str]:
    """Run the load, apply `fault` (in a thread) after `settle` seconds, keep the load `window`
    seconds from the fault's start; then how long the gateway took to hold no slot."""
    loads = {name: ChatLoad(gateway_url, MODEL, clients) for name, clients in GROUPS}
    stop = asyncio.Event()
    running = asyncio.gather(*(load.run(stop) for load in loads.values()))
    try:
        await asyncio.sleep(settle)
        start = time.monotonic()
        note = await asyncio.to_thread(fault) or ""
        await asyncio.sleep(max(0.0, start + window - time.monotonic()))
        end = time.monotonic()
    finally:
        stop.set()
        await running
    released, leaked = await asyncio.to_thread(slots_released, gateway_url, SLOT_BOUND_SECONDS)
    return {name: load.window(start, end) for name, load in loads.items()}, released, leaked, note


def serving_host(gateway_url: str) -> str | None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = httpx.post(f"{gateway_url}/v1/chat/completions", json=body, timeout=30)
    return r.headers.get("x-grid-host") if r.status_code == 200 else None


def set_replicas(grid: ClusterGrid, n: int) -> bool:
    done = grid.gridctl("model", "set", MODEL, "--memory-mb", "512", "--min-replicas", str(n), "--max-replicas", str(n))
    return done.returncode == 0


def copies(grid: ClusterGrid) -> dict[str, set[str]]:
    """host -> the model's residency states on it (the controller's view)."""
    status = grid.gridctl("status", "--json")
    doc = json.loads(status.stdout) if status.returncode == 0 else {}
    out: dict[str, set[str]] = {}
    for h in doc.get("hosts") or []:
        if not h.get("fresh", True):
            continue
        states = {r.get("state") for r in h.get("residencies") or [] if r.get("model_id") == MODEL}
        out[h.get("host_id")] = {s for s in states if s}
    return out


HOST_PATH_BOUND_SECONDS = 10.0


def node_of_agent(grid: ClusterGrid, host_id: str) -> int | None:
    """The NATS node a host's agent is connected to (every agent's connection has the same name,
    so by the address its sockets reach)."""
    agent = grid.procs[f"agent-{host_id}"]
    for proc in [psutil.Process(agent.pid), *psutil.Process(agent.pid).children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            for conn in proc.net_connections(kind="tcp"):
                if conn.raddr and conn.raddr.ip in grid.network.addresses:
                    return grid.network.addresses.index(conn.raddr.ip)
    return None


class LongStream:
    """A long streamed answer through the gateway, read in a thread: which host serves it, when
    its first bytes came, when and how it ended."""

    def __init__(self, gateway_url: str, affinity_key: str) -> None:
        self.url, self.key = f"{gateway_url}/v1/chat/completions", affinity_key
        self.host: str | None = None
        self.started = asyncio.Event()
        self.ended_at: float | None = None
        self.last_event = ""
        self.abandoned = False  # set to stop reading (the client hangs up)

    def read(self, loop: asyncio.AbstractEventLoop) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Count"}], "max_tokens": 1500,
                "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", self.url, json=body, headers={"X-Grid-Affinity-Key": self.key},
                              timeout=600) as r:
                self.host = r.headers.get("x-grid-host")
                for line in r.iter_lines():
                    if self.abandoned:
                        break
                    if line.startswith("data: "):
                        self.last_event = line
                        loop.call_soon_threadsafe(self.started.set)
        except httpx.HTTPError as exc:
            self.last_event = f"transport error: {type(exc).__name__}"
        finally:
            self.ended_at = time.monotonic()
            loop.call_soon_threadsafe(self.started.set)

    def outcome(self) -> str:
        if self.last_event.startswith("data: {\"error\""):
            return json.loads(self.last_event[6:])["error"]["code"]
        return "completed" if self.last_event == "data: [DONE]" else self.last_event[:80]


async def host_path_killed(grid: ClusterGrid, window: float, baseline: Row) -> Row:
    """Kill the node a serving host's agent is on (not the gateway's) with a long stream in flight
    there, under the load; the note says how long that stream took to end, and how."""
    gateway_node = grid.node_of("grid-gateway")
    loop = asyncio.get_running_loop()
    for attempt in range(12):  # a stream that lands on a host whose node the gateway shares is tried again
        stream = LongStream(grid.gateway_url, f"long-{attempt}")
        reader = asyncio.create_task(asyncio.to_thread(stream.read, loop))
        await asyncio.wait_for(stream.started.wait(), 120)
        node = node_of_agent(grid, stream.host) if stream.host else None
        if node is not None and node != gateway_node and stream.ended_at is None:
            break
        stream.abandoned = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(reader, 120)
    else:
        raise SystemExit("no long stream landed on a host whose NATS node differs from the gateway's")
    killed: list[float] = []

    def kill() -> str:
        grid.kill_node(node)
        killed.append(time.monotonic())
        return f"node grid-n{node + 1} killed (host {stream.host}'s; the gateway is on grid-n{gateway_node + 1})"

    print(f"  (a long stream on {stream.host}, its agent on grid-n{node + 1}; killing that node)", flush=True)
    windows, released, leaked, note = await under_load(grid.gateway_url, kill, window=window, settle=1.0)
    stream.abandoned = True  # read to its end, or hang up if it is still going
    await asyncio.wait_for(reader, 600)
    took = (stream.ended_at or time.monotonic()) - killed[0]
    verdict = "within" if took <= HOST_PATH_BOUND_SECONDS else "NOT within"
    row = Row("host path killed (stream in flight)", windows, released, leaked,
              f"{note}; the stream in flight ended {took:.1f}s after the kill ({verdict} "
              f"{HOST_PATH_BOUND_SECONDS:.0f}s) with {stream.outcome()}")
    print_row(row, baseline)
    grid.restart_node(node)
    return row


async def agent_stopped(grid: ClusterGrid, window: float, baseline: Row) -> Row:
    """SIGSTOP the agent of one of two ready copies for the window, then SIGCONT."""
    victim = serving_host(grid.gateway_url) or "a1"
    agent = grid.procs[f"agent-{victim}"]

    def stop() -> str:
        os.kill(agent.pid, signal.SIGSTOP)
        return f"agent {victim} stopped"

    try:
        windows, released, leaked, note = await under_load(grid.gateway_url, stop, window=window)
    finally:
        os.kill(agent.pid, signal.SIGCONT)
    row = Row("agent SIGSTOP (2 copies)", windows, released, leaked, note + "; resumed after the window")
    print_row(row, baseline)
    return row


def engine_processes(agent_pid: int) -> list[psutil.Process]:
    """The llama.cpp engines an agent started (its descendants serving a model)."""
    found = []
    for child in psutil.Process(agent_pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmdline = " ".join(child.cmdline())
            if "--model" in cmdline and ("llama-server" in cmdline or "xllamacpp" in cmdline):
                found.append(child)
    return found


async def engine_stopped(grid: ClusterGrid, window: float, baseline: Row) -> Row:
    """SIGSTOP the engine of one of two ready copies for the window (its agent keeps running),
    then SIGCONT: the agent must notice on its own (grid.infer.responder's health checks)."""
    victim = serving_host(grid.gateway_url) or "a1"
    engines = engine_processes(grid.procs[f"agent-{victim}"].pid)
    if not engines:
        raise SystemExit(f"no engine process found under agent {victim}")

    def stop() -> str:
        for engine in engines:
            engine.send_signal(signal.SIGSTOP)
        return f"engine(s) {[e.pid for e in engines]} of {victim} stopped"

    try:
        windows, released, leaked, note = await under_load(grid.gateway_url, stop, window=window)
    finally:
        for engine in engines:
            with contextlib.suppress(psutil.Error):
                engine.send_signal(signal.SIGCONT)
    row = Row("engine SIGSTOP (2 copies)", windows, released, leaked, note + "; resumed after the window")
    print_row(row, baseline)
    return row


def two_ready_copies(grid: ClusterGrid) -> None:
    # The controller may still be answering `log_unavailable` while the streams settle after a
    # node came back.
    wait(lambda: set_replicas(grid, 2), 60, "the model set to two copies", interval=1.0)
    wait(lambda: sum(1 for s in copies(grid).values() if s == {"ready"}) >= 2, 300, "two ready copies")
    time.sleep(3.0)  # a few heartbeats: the gateway's view follows the hosts'


async def on_the_cluster(base: Path, window: float) -> tuple[Row, list[Row]]:
    grid = ClusterGrid(base)
    rows: list[Row] = []
    try:
        grid.start_nats()
        grid.start_grid(agents=2)
        gw = grid.gateway_url
        windows, released, leaked, _ = await under_load(gw, lambda: None, window=window)
        baseline = Row("baseline (no fault)", windows, released, leaked)
        print_row(baseline, None)

        # Drain the host of the only copy: make-before-break, the other host can hold the model.
        holder = serving_host(gw)
        assert holder is not None

        def drain() -> str:
            done = grid.gridctl("node", "drain", "--reason", "bench", home=base / holder)
            return f"drained {holder}" + ("" if done.returncode == 0 else f" (drain failed: {done.stderr.strip()})")

        windows, released, leaked, note = await under_load(gw, drain, window=max(window, 90.0))
        after = copies(grid)
        rows.append(Row("single-copy drain (60 s deadline)", windows, released, leaked,
                        f"{note}; copies after: {after}"))
        print_row(rows[-1], baseline)
        grid.gridctl("node", "resume", home=base / holder)

        # A silent NATS node: the one the gateway is on.
        victim = grid.node_of("grid-gateway")
        assert victim is not None

        def silence() -> str:
            grid.network.silence(victim)
            return f"node grid-n{victim + 1} silent (the gateway's)"

        windows, released, leaked, note = await under_load(gw, silence, window=window)
        rows.append(Row("silent NATS node", windows, released, leaked, note))
        print_row(rows[-1], baseline)
        grid.network.unsilence(victim)
        wait(lambda: grid.node_healthy(victim), 60, "the silenced node healthy again")

        two_ready_copies(grid)
        rows.append(await host_path_killed(grid, window, baseline))
        print("  (waiting for two ready copies again)", flush=True)
        two_ready_copies(grid)
        rows.append(await agent_stopped(grid, window, baseline))
        two_ready_copies(grid)
        rows.append(await engine_stopped(grid, window, baseline))

        # A dead agent, with another ready copy to go to.
        two_ready_copies(grid)
        victim_host = serving_host(gw) or "a1"

        def kill_agent() -> str:
            grid.procs[f"agent-{victim_host}"].send_signal(signal.SIGKILL)
            return f"agent {victim_host} killed (its engine runs on)"

        windows, released, leaked, note = await under_load(gw, kill_agent, window=window)
        rows.append(Row("agent kill -9 (2 copies)", windows, released, leaked, note))
        print_row(rows[-1], baseline)
        return baseline, rows
    finally:
        grid.stop()


class UpGrid:
    """`gridctl up` (embedded NATS, one host) with its home on `home`."""

    def __init__(self, home: Path, log: Path) -> None:
        self.home, self.log = home, log
        (home / "artifacts").symlink_to(CACHE / "artifacts")
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("GRID_")}, "GRID_HOME": str(home),
               "COLUMNS": "200"}
        with open(log, "w") as out:
            self.proc = subprocess.Popen([*GRIDCTL, "up", "--port", "0", "--no-dashboard", "--log-budget", "256MiB"],
                                         env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        text = wait(lambda: (t := log.read_text(errors="replace")) and ("ready:" in t) and t, 300,
                    "gridctl up ready", interval=0.5)
        match = re.search(r"gateway\s+(http://\S+)/v1", text)
        assert match is not None, text[-2000:]
        self.gateway_url = match.group(1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


async def on_up(base: Path, window: float, baseline: Row | None) -> list[Row]:
    rows: list[Row] = []
    home = base / "up-home"
    home.mkdir(parents=True)
    # The grid's store on a small tmpfs, so the disk can be filled.
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1g,mode=0700", "tmpfs", str(home)], check=True)
    up: UpGrid | None = None
    try:
        up = UpGrid(home, base / "up.log")
        gw = up.gateway_url
        wait(lambda: serving_host(gw), 120, "gridctl up serves a chat")
        windows, released, leaked, _ = await under_load(gw, lambda: None, window=window)
        up_baseline = Row("baseline on gridctl up (no fault)", windows, released, leaked)
        print_row(up_baseline, None)

        def kill_nats() -> str:
            pid = int((home / "nats" / "nats-server.pid").read_text())
            os.kill(pid, signal.SIGKILL)
            return f"nats-server {pid} killed"

        windows, released, leaked, note = await under_load(gw, kill_nats, window=window)
        rows.append(Row("embedded NATS kill -9 (requests in flight)", windows, released, leaked, note))
        print_row(rows[-1], up_baseline)

        filler = home / "filler"

        def fill_then_free() -> str:
            subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=1M", "count=2048"], capture_output=True)
            full_for = window / 3
            time.sleep(full_for)
            filler.unlink()
            return f"disk full for {full_for:.0f}s, then freed"

        windows, released, leaked, note = await under_load(gw, fill_then_free, window=window * 2)
        rows.append(Row("disk full, then freed", windows, released, leaked, note))
        print_row(rows[-1], up_baseline)
        return rows
    finally:
        if up is not None:
            up.stop()
        with contextlib.suppress(Exception):
            filler.unlink()
        subprocess.run(["umount", "-l", str(home)], check=False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--window", type=float, default=25.0, help="Seconds of load measured from each fault's start.")
    p.add_argument("--skip-cluster", action="store_true", help="Skip the faults on the scaled-out cluster grid.")
    p.add_argument("--skip-up", action="store_true", help="Skip the faults on `gridctl up` (NATS kill, disk full).")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="grid-bench-faults-") as d:
        baseline = None
        if not a.skip_cluster:
            baseline, _ = asyncio.run(on_the_cluster(Path(d) / "cluster", a.window))
        if not a.skip_up:
            asyncio.run(on_up(Path(d), a.window, baseline))


if __name__ == "__main__":
    main()
