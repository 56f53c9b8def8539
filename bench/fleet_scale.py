"""Fleet scale: one controller, a gateway and the DuckDB sink against thousands of simulated hosts.

For each size in --hosts: a real 3-node nats-server cluster on this machine's loopback (operator
mode, R3 streams, sync_interval always), a credential minted per host (Authority.issue_host_creds:
one registry write for the whole fleet), a real controller (`gridctl serve controller`, automatic
mode, its DuckDB sink in process) that provisions every host's command consumer at start, a real
gateway (`gridctl serve gateway`) following the log, and the hosts run by bench._sim_hosts in a
few processes (2,500 hosts each): each signs its own heartbeats every 5 s and acknowledges its
commands with modelled durations; nothing is served.

The catalog is 64 models (2-8 GB each) whose replicas ask for about 40% of the fleet's memory;
every 20 s a quarter of them change their replica count (demand changing). Measured over
--duration seconds after the fleet's first heartbeats are in and the first wave of commands is out:

* controller tick p50/p99 (grid_controller_last_tick_seconds, scraped at 4 Hz);
* heartbeat fold rate (GRID_HOSTS messages folded per second) and fold lag (how long the oldest
  message the controller has not folded has been in the log; 0 when caught up);
* plan and command publish rates (GRID_PLANS and GRID_CMDS appends per second);
* the gateway's routing-state lag behind GRID_HOSTS and the sink's (same definition);
* RSS of every process at the start and end of the window, and NATS CPU (all three nodes, % of one core).

Lags are measured against the log's last sequence sampled every 0.25 s, so they resolve to about
0.25 s. The ratio column is each size's tick p99 against the smallest size's, in the same run.
Goals per size: tick p99 <= 2 s, gateway routing state <= 1 s behind the log, RSS growth over the
window under 10% (a short window shows a trend, not the 30-minute figure).

    python -m bench.fleet_scale [--hosts 1000,2500,5000,10000] [--duration 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grid.events.base import new_event_id  # noqa: E402
from grid.events.control import ModelProfile, ModeSet, ProfileSet  # noqa: E402
from grid.events.subjects import COMMANDS_STREAM, HOSTS_STREAM, PLANS_STREAM  # noqa: E402
from grid.identity.authority import Authority  # noqa: E402
from grid.identity.connect import connect_log  # noqa: E402
from grid.identity.creds import write_creds  # noqa: E402
from grid.identity.local import authority_dir, ensure_local_credentials  # noqa: E402
from grid.identity.server import SecuredNatsCluster  # noqa: E402
from grid.transport.embedded import free_port  # noqa: E402

GRIDCTL = [sys.executable, "-m", "grid.cli.main"]
HOSTS_PER_PROCESS = 2500
MODELS = 64
HEARTBEAT_SECONDS = 5.0
DEMAND_CHANGE_SECONDS = 20.0
SAMPLE_SECONDS = 0.25
FILL = 0.4  # share of the fleet's memory the catalog's replicas ask for


def catalog(hosts: int, rng: random.Random) -> list[ModelProfile]:
    sizes = [2000 + 1000 * (m % 7) for m in range(MODELS)]
    budget = FILL * hosts * (32768 - 2048)
    per_model = budget / MODELS
    return [ModelProfile(model_id=f"model-{m:02d}.gguf", memory_mb=sizes[m],
                         min_replicas=max(1, int(per_model / sizes[m] * rng.uniform(0.5, 1.5))),
                         max_replicas=max(1, int(per_model / sizes[m] * 2)),
                         load_seconds=4.0, warm_seconds=1.0, min_residency_seconds=0.0,
                         scale_down_cooldown_seconds=0.0)
            for m in range(MODELS)]


def changed(profile: ModelProfile, rng: random.Random) -> ModelProfile:
    replicas = max(1, min(profile.max_replicas, int(profile.min_replicas * rng.uniform(0.7, 1.3))))
    return ModelProfile(**{**{f: getattr(profile, f) for f in profile.__struct_fields__}, "min_replicas": replicas})


def env(home: Path) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("GRID_")}, "GRID_HOME": str(home)}


def spawn(base: Path, name: str, args: list[str], home: Path) -> subprocess.Popen[bytes]:
    with open(base / f"{name}.log", "ab") as out:
        return subprocess.Popen(args, env=env(home), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def metric(text: str, name: str, label: str | None = None) -> float | None:
    pattern = re.escape(name) + (r'\{[^}]*"?' + re.escape(label) + r'"?[^}]*\}' if label else r"") + r" ([0-9.e+-]+)"
    m = re.search(r"^" + pattern + r"$", text, re.M)
    return float(m.group(1)) if m else None


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


class Lag:
    """How long the oldest log message a reader has not folded has been in the log."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[int, float]] = []  # (last_seq, first time seen)
        self.samples: list[float] = []

    def log_at(self, last_seq: int, now: float) -> None:
        if not self.arrivals or last_seq > self.arrivals[-1][0]:
            self.arrivals.append((last_seq, now))

    def reader_at(self, position: float | None, now: float) -> None:
        if position is None or not self.arrivals:
            return
        if position >= self.arrivals[-1][0]:
            self.samples.append(0.0)
            return
        for seq, seen in self.arrivals:  # the first sample at which message position+1 was in the log
            if seq > position:
                self.samples.append(now - seen)
                return


async def one_size(hosts: int, duration: float, base: Path, profile: Path | None = None) -> dict[str, object]:
    rng = random.Random(hosts)
    home = base / "grid"
    now = time.time()
    local = ensure_local_credentials(home, host_ids=[], now=now)
    authority = Authority(authority_dir(home))
    host_ids = [f"sim-{i:05d}" for i in range(hosts)]
    t0 = time.perf_counter()
    minted = authority.issue_host_creds(host_ids, now=now, ttl_seconds=24 * 3600.0)
    creds_dir = base / "hosts"
    creds_dir.mkdir()
    paths = {h: write_creds(creds_dir / f"{h}.creds", token, seed) for h, (token, seed) in minted.items()}
    mint_s = time.perf_counter() - t0

    cluster = SecuredNatsCluster(base / "cluster", authority, nodes=3)
    cluster.start()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        admin_port, gateway_port = free_port(), free_port()
        t0 = time.perf_counter()
        profiler = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "grid.cli.main"] if profile else GRIDCTL
        procs["controller"] = spawn(base, "controller", [
            *profiler, "serve", "controller", "--nats", cluster.url, "--port", str(admin_port), "--tick-interval", "1",
            "--assume-durable", "--log-format", "json", "--max-mutations", str(max(64, hosts // 10))], home)
        ctl_metrics = f"http://127.0.0.1:{admin_port}/metrics"
        async with httpx.AsyncClient(timeout=5.0) as http:
            while True:
                if procs["controller"].poll() is not None:
                    raise SystemExit(f"the controller exited; see {base / 'controller.log'}")
                try:
                    if (await http.get(ctl_metrics)).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.2)
            controller_start_s = time.perf_counter() - t0  # includes provisioning every host's consumer

            operator = await connect_log(cluster.url, credentials=local.operator, name="bench-operator",
                                         ensure_streams=False)
            profiles = catalog(hosts, rng)
            for p in profiles:
                await operator.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=p))
            await operator.append(ModeSet(event_id=new_event_id(), at=time.time(), mode="automatic"))

            procs["gateway"] = spawn(base, "gateway", [
                *GRIDCTL, "serve", "gateway", "--nats", cluster.url, "--port", str(gateway_port),
                "--log-format", "json"], home)
            stats_files = []
            for k in range(0, hosts, HOSTS_PER_PROCESS):
                chunk = host_ids[k:k + HOSTS_PER_PROCESS]
                listing = base / f"hosts-{k // HOSTS_PER_PROCESS}.txt"
                listing.write_text("".join(f"{h} {paths[h]}\n" for h in chunk))
                stats_files.append(base / f"hosts-{k // HOSTS_PER_PROCESS}.stats")
                procs[f"hosts-{k // HOSTS_PER_PROCESS}"] = spawn(
                    base, f"hosts-{k // HOSTS_PER_PROCESS}",
                    [sys.executable, "-m", "bench._sim_hosts", cluster.url, str(listing), str(stats_files[-1]),
                     "--interval", str(HEARTBEAT_SECONDS)], home)

            def host_stats() -> list[dict[str, object]]:
                docs = []
                for f in stats_files:
                    lines = f.read_text().splitlines() if f.exists() else []
                    if lines:
                        docs.append(json.loads(lines[-1]))
                return docs

            # Warm-up: every host connected and one heartbeat round in.
            t0 = time.perf_counter()
            while True:
                for name, p in procs.items():
                    if p.poll() is not None:
                        raise SystemExit(f"{name} exited; see {base / (name + '.log')}")
                docs = host_stats()
                if sum(int(d["connected"]) for d in docs) >= hosts and sum(int(d["heartbeats"]) for d in docs) >= hosts:
                    break
                if time.perf_counter() - t0 > 600:
                    raise SystemExit(f"the fleet did not connect within 600 s: {docs}")
                await asyncio.sleep(1.0)
            connect_s = time.perf_counter() - t0
            await asyncio.sleep(2 * HEARTBEAT_SECONDS)  # the first wave of commands goes out

            nats_procs = [psutil.Process(n.process.pid) for n in cluster.nodes if n.process is not None]
            watched = {name: psutil.Process(p.pid) for name, p in procs.items()}
            rss_start = {name: p.memory_info().rss for name, p in watched.items()}
            nats_rss_start = sum(p.memory_info().rss for p in nats_procs)
            nats_cpu0 = sum(sum(p.cpu_times()[:2]) for p in nats_procs)
            ctl_cpu0 = sum(watched["controller"].cpu_times()[:2])
            gw_cpu0 = sum(watched["gateway"].cpu_times()[:2])
            first = {s: await operator.last_sequence(s) for s in (HOSTS_STREAM, PLANS_STREAM, COMMANDS_STREAM)}
            ctl_text = (await http.get(ctl_metrics)).text
            folded0 = metric(ctl_text, "grid_controller_log_position", HOSTS_STREAM) or 0.0
            hb0 = sum(int(d["heartbeats"]) for d in host_stats())
            ticks: list[float] = []
            tick_count = metric(ctl_text, "grid_controller_tick_seconds_count") or 0.0
            fold, gateway, sink = Lag(), Lag(), Lag()
            append_p99: list[float] = []
            start = time.perf_counter()
            next_change = start + DEMAND_CHANGE_SECONDS
            mid_rss: dict[str, int] = {}
            while (elapsed := time.perf_counter() - start) < duration:
                if not mid_rss and elapsed >= duration / 2:
                    mid_rss = {name: p.memory_info().rss for name, p in watched.items()}
                if time.perf_counter() >= next_change:
                    next_change += DEMAND_CHANGE_SECONDS
                    for i in rng.sample(range(MODELS), MODELS // 4):
                        profiles[i] = changed(profiles[i], rng)
                        await operator.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=profiles[i]))
                t = time.perf_counter()
                last = await operator.last_sequence(HOSTS_STREAM)
                for lag in (fold, gateway, sink):
                    lag.log_at(last, t)
                try:
                    ctl_text = (await http.get(ctl_metrics)).text
                    stats = (await http.get(f"http://127.0.0.1:{gateway_port}/gateway/stats")).json()
                except httpx.HTTPError:
                    await asyncio.sleep(SAMPLE_SECONDS)
                    continue
                t = time.perf_counter()
                fold.reader_at(metric(ctl_text, "grid_controller_log_position", HOSTS_STREAM), t)
                sink.reader_at(metric(ctl_text, "grid_analytics_log_position", HOSTS_STREAM), t)
                gateway.reader_at(stats.get("projection", {}).get("positions", {}).get(HOSTS_STREAM), t)
                count = metric(ctl_text, "grid_controller_tick_seconds_count") or 0.0
                if count > tick_count:
                    tick_count = count
                    last_tick = metric(ctl_text, "grid_controller_last_tick_seconds")
                    if last_tick is not None:
                        ticks.append(last_tick)
                for d in host_stats():
                    if d.get("append_p99_ms") is not None:
                        append_p99.append(float(d["append_p99_ms"]))  # type: ignore[arg-type]
                await asyncio.sleep(max(0.0, SAMPLE_SECONDS - (time.perf_counter() - t)))
            window = time.perf_counter() - start
            # The controller's own account of its recent ticks (status is built once, after the window).
            status = (await http.get(f"http://127.0.0.1:{admin_port}/allocator/status", timeout=60.0)).json()
            recent = status.get("ticks") or []
            phases = {k: pct([float(t.get(k) or 0.0) for t in recent], 0.5)
                      for k in ("forecast_ms", "plan_ms", "reconcile_ms", "publish_ms", "cpu_ms", "duration_ms")}
            recorded = sum(1 for t in recent if t.get("plan_recorded"))
            end = {s: await operator.last_sequence(s) for s in (HOSTS_STREAM, PLANS_STREAM, COMMANDS_STREAM)}
            folded1 = metric(ctl_text, "grid_controller_log_position", HOSTS_STREAM) or 0.0
            hb1 = sum(int(d["heartbeats"]) for d in host_stats())
            errors = sum(int(d["heartbeat_errors"]) + int(d["ack_errors"]) for d in host_stats())
            rss_end = {name: p.memory_info().rss for name, p in watched.items()}
            nats_cpu = (sum(sum(p.cpu_times()[:2]) for p in nats_procs) - nats_cpu0) / window
            ctl_cpu = (sum(watched["controller"].cpu_times()[:2]) - ctl_cpu0) / window
            gw_cpu = (sum(watched["gateway"].cpu_times()[:2]) - gw_cpu0) / window
            nats_rss = sum(p.memory_info().rss for p in nats_procs)
            await operator.close()
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        cluster.stop()
    mb = 1 << 20
    growth = {name: (rss_end[name] - mid_rss.get(name, rss_start[name])) / max(1, mid_rss.get(name, rss_start[name]))
              for name in rss_end}
    return {
        "hosts": hosts, "mint_s": mint_s, "controller_start_s": controller_start_s, "connect_s": connect_s,
        "window_s": window, "ticks": len(ticks), "tick_p50": pct(ticks, 0.5), "tick_p99": pct(ticks, 0.99),
        "tick_max": max(ticks) if ticks else None,
        "heartbeats_per_s": (hb1 - hb0) / window, "fold_per_s": (folded1 - folded0) / window,
        "hosts_appended_per_s": (end[HOSTS_STREAM] - first[HOSTS_STREAM]) / window,
        "fold_lag_p99": pct(fold.samples, 0.99), "gateway_lag_p50": pct(gateway.samples, 0.5),
        "gateway_lag_p99": pct(gateway.samples, 0.99), "sink_lag_p99": pct(sink.samples, 0.99),
        "plans_per_s": (end[PLANS_STREAM] - first[PLANS_STREAM]) / window,
        "commands_per_s": (end[COMMANDS_STREAM] - first[COMMANDS_STREAM]) / window,
        "append_p99_ms": pct(append_p99, 0.5), "host_errors": errors, "phases_ms": phases,
        "recent_ticks": len(recent), "recent_recorded": recorded,
        "rss_mb": {name: rss_end[name] / mb for name in rss_end}, "rss_start_mb": {n: v / mb for n, v in rss_start.items()},
        "rss_growth": growth, "nats_rss_mb": nats_rss / mb, "nats_rss_start_mb": nats_rss_start / mb,
        "nats_cpu_pct": nats_cpu * 100, "controller_cpu_pct": ctl_cpu * 100, "gateway_cpu_pct": gw_cpu * 100,
    }


def fmt(x: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if x is None else f"{x * scale:.{digits}f}"


def report(rows: list[dict[str, object]]) -> None:
    base_p99 = rows[0]["tick_p99"] if rows else None
    print(f"load average before the last size: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("fleet scale: one controller, gateway and DuckDB sink; real 3-node nats-server cluster (R3, operator mode, "
          f"sync always); heartbeat every {HEARTBEAT_SECONDS:.0f} s")
    print(f"{'hosts':>6} {'tick p50':>9} {'tick p99':>9} {'x smallest':>10} {'hb/s':>7} {'folded/s':>9} "
          f"{'fold lag':>9} {'gw lag p99':>10} {'sink lag':>9} {'plans/s':>8} {'cmds/s':>7} {'NATS CPU':>9} "
          f"{'ctl CPU':>8} {'gw CPU':>7}")
    for r in rows:
        ratio = (r["tick_p99"] / base_p99) if (r["tick_p99"] and base_p99) else None  # type: ignore[operator]
        print(f"{r['hosts']:>6} {fmt(r['tick_p50'], 1000, 0):>7}ms {fmt(r['tick_p99'], 1000, 0):>7}ms "  # type: ignore[arg-type]
              f"{fmt(ratio):>9}x {r['heartbeats_per_s']:>7.0f} {r['fold_per_s']:>9.0f} "
              f"{fmt(r['fold_lag_p99']):>8}s {fmt(r['gateway_lag_p99']):>9}s {fmt(r['sink_lag_p99']):>8}s "  # type: ignore[arg-type]
              f"{r['plans_per_s']:>8.2f} {r['commands_per_s']:>7.1f} {r['nats_cpu_pct']:>8.0f}% "
              f"{r['controller_cpu_pct']:>7.0f}% {r['gateway_cpu_pct']:>6.0f}%")
    print()
    print("memory (RSS MB, window start -> end; growth over the second half of the window)")
    for r in rows:
        parts = [f"{n} {r['rss_start_mb'][n]:.0f}->{r['rss_mb'][n]:.0f} ({r['rss_growth'][n] * 100:+.0f}%)"  # type: ignore[index]
                 for n in r["rss_mb"]]  # type: ignore[union-attr]
        print(f"{r['hosts']:>6} {'; '.join(parts)}; NATS (3 nodes) {r['nats_rss_start_mb']:.0f}->{r['nats_rss_mb']:.0f}")
    print()
    print("setup (s): mint credentials, controller start (provisions every host's command consumer), fleet connect")
    for r in rows:
        print(f"{r['hosts']:>6} mint {r['mint_s']:.1f}  controller {r['controller_start_s']:.1f}  "
              f"connect {r['connect_s']:.1f}  window {r['window_s']:.0f}  ticks seen {r['ticks']}  "
              f"host append p99 {fmt(r['append_p99_ms'], 1, 0)} ms  host errors {r['host_errors']}")
    print()
    print("tick phases (median of the controller's recent ticks, ms) and how many of them recorded a new plan")
    for r in rows:
        ph = r["phases_ms"]
        print(f"{r['hosts']:>6} " + "  ".join(f"{k[:-3]} {fmt(v, 1, 0)}" for k, v in ph.items())  # type: ignore[union-attr]
              + f"  plan recorded {r['recent_recorded']}/{r['recent_ticks']}")
    print()
    for r in rows:
        misses = []
        if r["tick_p99"] is None or r["tick_p99"] > 2.0:  # type: ignore[operator]
            misses.append(f"tick p99 {fmt(r['tick_p99'])} s > 2 s")  # type: ignore[arg-type]
        if r["gateway_lag_p99"] is None or r["gateway_lag_p99"] > 1.0:  # type: ignore[operator]
            misses.append(f"gateway {fmt(r['gateway_lag_p99'])} s behind > 1 s")  # type: ignore[arg-type]
        grown = [n for n, g in r["rss_growth"].items() if g > 0.10]  # type: ignore[union-attr]
        if grown:
            misses.append("RSS grew >10% in the second half: " + ", ".join(grown))
        verdict = "meets the goals" if not misses else "misses: " + "; ".join(misses)
        print(f"{r['hosts']:>6} hosts: {verdict}")


async def main(sizes: list[int], duration: float, keep: bool, profile: Path | None) -> None:
    rows = []
    for n in sizes:
        base = Path(tempfile.mkdtemp(prefix=f"grid-fleet-{n}-"))
        try:
            if profile is not None:
                profile.parent.mkdir(parents=True, exist_ok=True)
            rows.append(await one_size(n, duration, base,
                                       profile.with_suffix(f".{n}.prof") if profile is not None else None))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        finally:
            if not keep:
                shutil.rmtree(base, ignore_errors=True)
            else:
                print(f"kept {base}", file=sys.stderr)
    report(rows)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", default="1000,2500,5000,10000", help="fleet sizes, comma-separated")
    ap.add_argument("--duration", type=float, default=60.0, help="measured window per size, seconds")
    ap.add_argument("--keep", action="store_true", help="keep each size's directory (logs) for inspection")
    ap.add_argument("--profile", type=Path, default=None,
                    help="run the controller under cProfile, writing PROFILE.<hosts>.prof per size")
    args = ap.parse_args()
    asyncio.run(main([int(x) for x in args.hosts.split(",")], args.duration, args.keep, args.profile))
