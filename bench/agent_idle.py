"""The idle host agent's CPU: this tree against a baseline revision, in the same run.

An agent on a borrowed laptop spends most of its life with a ready engine and no requests; what
it burns then is taken from the machine's owner. Each tree's agent runs as its own process (as
`gridctl node start` runs it: Grid's event loop, real psutil sensors, a JetStream log on a real
nats-server) and is told to warm the bundled SmolLM2-135M GGUF on the xllamacpp runtime by a
command issued the controller's way. Once both engines are ready and the agents have settled,
both agents' CPU time (user + system) is read over the same idle windows, so whatever else the
machine does hits both alike; the figure is CPU ms per second of wall time, and the ratio is
this tree's over the baseline's (median of the windows). Each agent's figure is also split
between its event-loop thread and its other threads (the `asyncio.to_thread` pool).

`--profile` then runs cProfile inside each agent for one more window (started and stopped by
SIGUSR1 and SIGUSR2) and prints each agent's top entries by own time. cProfile sees one thread,
so in that window the agent's `asyncio.to_thread` work (sensor reads, file writes) runs inline
on the loop, where the profile sees it; the CPU figures are from the unprofiled windows.

    python -m bench.agent_idle [--against main] [--windows 3] [--window-seconds 10] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path

import psutil

from bench._common import cpu_seconds

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("GRID_BENCH_CACHE", Path.home() / ".cache" / "grid-bench"))


def _baseline_tree(revision: str, into: Path) -> Path:
    """The `grid` package as of `revision`, extracted under `into`."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", revision, "grid"],
                             check=True, capture_output=True).stdout
    into.mkdir(parents=True, exist_ok=True)
    tar = into / "grid.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as t:
        t.extractall(into, filter="data")
    return into


def _seed_home(home: Path) -> None:
    """A GRID_HOME whose artifact cache holds the bundled GGUF (a hard link to the bench's cached
    copy, registered by ensure_bundled_model), so the warm command finds it."""
    from grid.agent.artifacts import BUNDLED_SHA256, ArtifactCache, ensure_bundled_model
    from grid.config import GridConfig

    source = ensure_bundled_model(GridConfig(home=CACHE, nats_url=None))
    home.mkdir(mode=0o700, parents=True)
    target = ArtifactCache(GridConfig(home=home, nats_url=None).artifacts_dir).blob_path(BUNDLED_SHA256)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
    ensure_bundled_model(GridConfig(home=home, nats_url=None))


def _warm(host: str):
    """A warm command for the bundled model on `host`, issued the controller's way."""
    from grid.agent.artifacts import BUNDLED_MODEL_ID, BUNDLED_SHA256
    from grid.controller.issue import Issuer, command_issued
    from grid.controller.reconcile import Action
    from grid.events.plan import make_generation

    action = Action(action_id=uuid.uuid4().hex, kind="warm", host_id=host, model_id=BUNDLED_MODEL_ID,
                    memory_mb=400, reason="bench", artifact_sha256=BUNDLED_SHA256, slots=1, context_size=2048)
    issuer = Issuer(controller_id="bench", controller_term=1, generation=make_generation("bench", 1, "d"))
    return command_issued(action, issuer, issued_at=time.time(), lease_remaining=60.0)


async def _wait_ready(log, hosts: set[str], timeout: float = 120.0) -> None:
    """Until every host in `hosts` heartbeats its bundled model ready."""
    from grid.agent.artifacts import BUNDLED_MODEL_ID
    from grid.events import codec
    from grid.events.host import HostHeartbeat
    from grid.events.subjects import HOSTS_STREAM

    waiting = set(hosts)
    sub = await log.subscribe(HOSTS_STREAM, start_seq=1)
    deadline = time.monotonic() + timeout
    try:
        while waiting and time.monotonic() < deadline:
            msg = await sub.next(timeout=max(0.01, deadline - time.monotonic()))
            if msg is None:
                continue
            event = codec.decode(msg.data)
            if isinstance(event, HostHeartbeat) and any(
                    r.model_id == BUNDLED_MODEL_ID and r.state == "ready" for r in event.residencies):
                waiting.discard(event.host_id)
    finally:
        await sub.close()
    if waiting:
        raise RuntimeError(f"no ready engine on {sorted(waiting)} within {timeout:.0f} s")


def _spawn_agent(name: str, tree: Path, nats_url: str, home: Path, ports: int, out_dir: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(tree), str(REPO))))
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.agent_idle", "serve-agent", nats_url, str(home), name, str(ports),
         str(out_dir / f"{name}.prof")],
        cwd=tree, env=env, stdout=subprocess.PIPE, stderr=open(out_dir / f"{name}.log", "wb"),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()
    if not line.startswith("serving "):
        raise RuntimeError(f"{name} agent did not start:\n" + (out_dir / f"{name}.log").read_text()[-3000:])
    grid_dir = Path(line.split(" ", 1)[1])
    if grid_dir.resolve() != (tree / "grid").resolve():
        raise RuntimeError(f"{name} agent imported grid from {grid_dir}, not from {tree}")
    return proc


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _thread_seconds(proc: psutil.Process) -> dict[str, float]:
    """CPU seconds of the process's event-loop thread ("loop") and of all its other threads
    ("other": the to_thread pool and any library's threads), by the kernel's per-thread times."""
    out = {"loop": 0.0, "other": 0.0}
    for t in proc.threads():
        out["loop" if t.id == proc.pid else "other"] += t.user_time + t.system_time
    return out


def _engines(proc: psutil.Process) -> list[psutil.Process]:
    with_children = proc.children(recursive=True)
    return [p for p in with_children if p.is_running()]


async def main(args: argparse.Namespace) -> None:
    from grid.transport.embedded import EmbeddedNats
    from grid.transport.jetstream import JetStreamLog

    with tempfile.TemporaryDirectory(prefix="grid-bench-idle-") as tmp:
        root = Path(tmp)
        trees = {"baseline": _baseline_tree(args.against, root / "baseline"), "this": REPO}
        nats = EmbeddedNats(root / "nats").start()
        procs: dict[str, subprocess.Popen] = {}
        log = None
        try:
            log = await JetStreamLog.connect(nats.url)
            for i, (name, tree) in enumerate(trees.items()):
                home = root / f"home-{name}"
                _seed_home(home)
                procs[name] = _spawn_agent(name, tree, nats.url, home, 39100 + 100 * i, root)
            for name in trees:
                await log.append(_warm(name))
            await _wait_ready(log, set(trees))
            await log.close()
            log = None  # the bench's own connection stays out of the idle windows
            agents = {n: psutil.Process(p.pid) for n, p in procs.items()}
            engines = {n: _engines(a) for n, a in agents.items()}
            await asyncio.sleep(args.settle)
            rates: dict[str, list[float]] = {n: [] for n in agents}
            engine_rates: dict[str, list[float]] = {n: [] for n in agents}
            threads: dict[str, dict[str, float]] = {n: {} for n in agents}
            for _ in range(args.windows):
                before_t = {n: _thread_seconds(a) for n, a in agents.items()}
                before = {n: cpu_seconds(a) for n, a in agents.items()}
                before_e = {n: sum(cpu_seconds(e) for e in engines[n]) for n in agents}
                t0 = time.perf_counter()
                await asyncio.sleep(args.window_seconds)
                elapsed = time.perf_counter() - t0
                for n, a in agents.items():
                    rates[n].append((cpu_seconds(a) - before[n]) * 1e3 / elapsed)
                    for kind, secs in _thread_seconds(a).items():
                        threads[n][kind] = threads[n].get(kind, 0.0) + (secs - before_t[n].get(kind, 0.0)) * 1e3 / elapsed
                    engine_rates[n].append((sum(cpu_seconds(e) for e in engines[n]) - before_e[n]) * 1e3 / elapsed)
            print(f"idle agent CPU, ms per second of wall time, {args.windows} windows of {args.window_seconds:.0f} s "
                  f"after {args.settle:.0f} s settling (one ready llama.cpp engine each, no requests)")
            for n in agents:
                label = f"{n} ({args.against})" if n == "baseline" else f"{n} tree"
                print(f"  {label:<22} median {statistics.median(rates[n]):6.2f}   windows "
                      + " ".join(f"{r:.2f}" for r in rates[n])
                      + f"   (its engine: {statistics.median(engine_rates[n]):.2f})")
                print(f"  {'':<22} by thread (mean): " + ", ".join(
                    f"{kind} {v / args.windows:.2f}" for kind, v in sorted(threads[n].items())))
            ratio = statistics.median(rates["this"]) / statistics.median(rates["baseline"])
            print(f"  ratio this/baseline (median): {ratio:.3f}")
            if args.profile:
                for p in procs.values():
                    p.send_signal(signal.SIGUSR1)
                await asyncio.sleep(args.window_seconds)
                for p in procs.values():
                    p.send_signal(signal.SIGUSR2)
                await asyncio.sleep(1.0)
                _print_profiles(root, list(procs), args.top)
                if args.profile_out is not None:
                    args.profile_out.mkdir(parents=True, exist_ok=True)
                    for name in procs:
                        with contextlib.suppress(FileNotFoundError):
                            shutil.copyfile(root / f"{name}.prof", args.profile_out / f"{name}.prof")
            print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
        finally:
            for p in procs.values():
                _stop(p)
            if log is not None:
                await log.close()
            nats.stop()


def _print_profiles(root: Path, names: list[str], top: int) -> None:
    import io
    import pstats

    for name in names:
        path = root / f"{name}.prof"
        if not path.exists():
            print(f"no profile from the {name} agent")
            continue
        out = io.StringIO()
        stats = pstats.Stats(str(path), stream=out)
        stats.sort_stats("tottime").print_stats(top)
        print(f"--- {name} agent: top {top} by own time over one profiled window")
        text = out.getvalue()
        start = text.find("   ncalls")
        print(text[start if start >= 0 else 0:].rstrip())


async def serve_agent(nats_url: str, home: Path, host: str, port_lo: int, profile_path: Path) -> None:
    """One agent as `gridctl node start` runs it, until SIGTERM; SIGUSR1 starts cProfile and
    SIGUSR2 writes its stats to `profile_path`."""
    import cProfile

    import grid
    from grid.agent.service import AgentOptions, HostAgent
    from grid.config import GridConfig
    from grid.logs import configure_logging
    from grid.transport.jetstream import JetStreamLog

    configure_logging("auto")
    log = await JetStreamLog.connect(nats_url, name="grid-agent")
    agent = HostAgent(log, GridConfig(home=home, nats_url=nats_url),
                      AgentOptions(host_id=host, port_range=(port_lo, port_lo + 99)))
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, agent.request_stop)
    profiler = cProfile.Profile()
    real_to_thread = asyncio.to_thread

    async def inline(func, /, *a, **kw):  # the profiled window only: thread work on the loop
        return func(*a, **kw)

    def start_profile() -> None:
        asyncio.to_thread = inline
        profiler.enable()

    def stop_profile() -> None:
        profiler.disable()
        asyncio.to_thread = real_to_thread
        profiler.dump_stats(str(profile_path))

    loop.add_signal_handler(signal.SIGUSR1, start_profile)
    loop.add_signal_handler(signal.SIGUSR2, stop_profile)
    await agent.start()
    print("serving", Path(grid.__file__).parent, flush=True)
    try:
        await agent.run_until_stopped()
    finally:
        await agent.stop(drain=True)
        await log.close()


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "serve-agent":
        from grid import eventloop

        eventloop.run(serve_agent(sys.argv[2], Path(sys.argv[3]), sys.argv[4], int(sys.argv[5]), Path(sys.argv[6])))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="main", help="baseline git revision (default main)")
    parser.add_argument("--windows", type=int, default=3, help="idle windows measured")
    parser.add_argument("--window-seconds", type=float, default=10.0)
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after both engines are ready")
    parser.add_argument("--profile", action="store_true", help="then profile each agent for one window")
    parser.add_argument("--top", type=int, default=25, help="profile entries printed")
    parser.add_argument("--profile-out", type=Path, default=None, help="also keep the profiles (pstats files) here")
    args = parser.parse_args()
    asyncio.run(main(args))
