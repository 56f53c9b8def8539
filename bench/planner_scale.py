"""Planner scale benchmark: full plans on seeded heterogeneous fleets.

Cells: 64, 512, 4096 hosts x 32, 128, 512 models (heterogeneous memory, runtimes, tags, data
tiers, failure domains, lifecycle states and load; seeded generator). Two plans per cell:

* cold   - empty fleet (every replica is a new placement);
* steady - the same fleet one tick later: the cold plan's replicas are live (mostly ready,
           some warming), their weights cached, throughput measured on some of them;
* full   - a saturated homogeneous fleet (8 GB hosts, 6 GB models, demand far above
           capacity, four priority classes): every model ends with a shortfall, exercising the
           repair lower bound, preemption search and shortfall explanations;
* pending - the cold fleet a moment later with the cold plan's new placements commanded and
           not yet loaded (``PlannerInput.pending``): the controller's steady tick while its
           first wave is in flight (every pending host is special for its model);
* wave   - bench.controller_tick's fleet as its steady tick plans it: identical 32 GB GPU hosts,
           32 models of 6 GB wanting hosts/64 replicas each (half the hosts hold 6 GB the
           planner does not manage), every replica of the first wave commanded and pending
           (32 models whatever the cell's model count).

Prints wall time, placements/s, plan size and the log-log slope of time in hosts per model
count. The baseline measured in the same run is the planner's reference full-scan candidate
search (``build_plan(reference_scan=True)``), run on the cells where it finishes quickly; the ratio
column is baseline time / indexed time (identical plan bytes are asserted).

    python bench/planner_scale.py            # full grid
    python bench/planner_scale.py --quick    # smallest cells only
    python bench/planner_scale.py --hosts 16384 --models 2048   # one cell
    python -m bench.planner_scale --hosts 10000 --models 64 --against ../main --clock cpu   # vs another tree

``--against TREE`` also times TREE's planner (another checkout, e.g. the main branch) on the very
same inputs in a child process right after this tree's, asserts identical plan bytes and prints
its time and the speed-up (its time / this tree's).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec

from grid.events.control import ModelProfile
from grid.events.host import CachedArtifact, HostLoad, HostResources
from grid.fleet.planning import DemandTarget, Harm, PendingPlacement, PlannerInput, Policy, encode_plan
from grid.fleet.views import HostView, ResidencyView
from grid.planner.plan import build_plan, plan

NOW = 1_000_000.0
GB = 1 << 30

# name, capacity MB, runtimes, backends, gpus, gpu MB, bandwidth GB/s, GFLOPS, tags, limit
HARDWARE = [
    (
        "laptop-16",
        16_384,
        ("llama.cpp", "mlx"),
        ("metal",),
        0,
        0,
        100.0,
        3_600.0,
        ("laptop", "battery"),
        2,
    ),
    (
        "laptop-32",
        32_768,
        ("llama.cpp",),
        ("cpu",),
        0,
        0,
        60.0,
        1_200.0,
        ("laptop", "battery"),
        2,
    ),
    (
        "studio-192",
        196_608,
        ("llama.cpp", "mlx"),
        ("metal",),
        0,
        0,
        800.0,
        27_000.0,
        ("ssd",),
        0,
    ),
    (
        "rtx4090-64",
        65_536,
        ("llama.cpp", "vllm"),
        ("cuda",),
        1,
        24_576,
        1_000.0,
        82_000.0,
        ("gpu", "ssd"),
        4,
    ),
    (
        "a100x2-256",
        262_144,
        ("vllm", "llama.cpp"),
        ("cuda",),
        2,
        81_920,
        2_000.0,
        312_000.0,
        ("gpu", "ssd", "dc"),
        0,
    ),
    (
        "cpu-128",
        131_072,
        ("llama.cpp",),
        ("cpu",),
        0,
        0,
        80.0,
        2_000.0,
        ("ssd", "dc"),
        0,
    ),
]
MEMORY = [1_024, 2_048, 4_096, 6_144, 8_192, 12_288, 16_384, 24_576, 40_960, 81_920]
MEMORY_W = [8, 14, 18, 12, 12, 10, 8, 8, 6, 4]


def make_hosts(rng: random.Random, n: int) -> list[HostView]:
    n_domains = max(4, n // 16)
    hosts = []
    for i in range(n):
        _name, cap, rts, bes, gpus, gmem, bw, gf, tags, limit = rng.choice(HARDWARE)
        r = rng.random()
        state = (
            "accepting"
            if r < 0.86
            else "throttled"
            if r < 0.94
            else rng.choice(["paused", "draining", "quarantined"])
        )
        hb = NOW - rng.uniform(0.0, 20.0) if rng.random() > 0.02 else NOW - 600.0
        t = rng.random()
        tier = "confidential" if t < 0.25 else "internal" if t < 0.9 else "public"
        extra = tuple(sorted({"eu" if rng.random() < 0.5 else "us"}))
        q = rng.random()
        hosts.append(
            HostView(
                host_id=f"host-{i:05d}",
                state=state,
                resources=HostResources(
                    capacity_mb=cap,
                    reserved_mb=rng.choice([0, 1_024, 2_048]),
                    runtimes=rts,
                    backends=bes,
                    memory_bandwidth_gbps=bw,
                    compute_gflops=gf,
                    failure_domain=f"rack-{rng.randrange(n_domains):03d}",
                    tags=tuple(sorted(tags + extra)),
                    data_tier=tier,
                    gpu_count=gpus,
                    gpu_memory_mb=gmem,
                    model_limit=limit,
                ),
                disk_free_bytes=rng.choice([64, 256, 1024]) * GB,
                disk_total_bytes=2048 * GB,
                load=HostLoad(queue_depth=0 if q < 0.8 else rng.choice([1, 4, 16])),
                heartbeat_at=hb,
            )
        )
    return hosts


def make_models(
    rng: random.Random, n: int
) -> tuple[list[ModelProfile], list[DemandTarget]]:
    profiles, demand = [], []
    for i in range(n):
        mid = f"model-{i:04d}.gguf"
        mem = rng.choices(MEMORY, MEMORY_W)[0]
        r = rng.random()
        rts = (
            ("llama.cpp",)
            if r < 0.6
            else ("llama.cpp", "vllm")
            if r < 0.85
            else ("vllm",)
            if r < 0.95
            else ("mlx", "llama.cpp")
        )
        rtm = {"vllm": int(mem * 1.3)} if "vllm" in rts else {}
        req = ("gpu",) if (rts == ("vllm",) or rng.random() < 0.1) else ()
        forb = ("battery",) if rng.random() < 0.3 else ()
        t = rng.random()
        tier = "internal" if t < 0.75 else "public" if t < 0.9 else "confidential"
        mn = rng.choice([0, 0, 1, 1, 2])
        mx = max(mn, rng.choice([1, 2, 3, 4]))
        profiles.append(
            ModelProfile(
                model_id=mid,
                memory_mb=mem,
                runtime_memory_mb=rtm,
                runtimes=rts,
                artifact_sha256=f"{i:064x}",
                artifact_size_mb=max(512, mem // 2),
                min_replicas=mn,
                max_replicas=mx,
                priority=rng.choice([0, 0, 0, 1, 1, 2, 3]),
                data_tier=tier,
                required_tags=req,
                forbidden_tags=forb,
                min_failure_domains=rng.choice([1, 1, 2]),
                max_colocated_models=rng.choice([0] * 9 + [1]),
                replica_concurrency=rng.choice([1, 4, 8]),
                load_seconds=rng.uniform(10.0, 120.0),
                warm_seconds=rng.uniform(5.0, 30.0),
            )
        )
        d = rng.random()
        if d < 0.6:
            demand.append(
                DemandTarget(
                    model_id=mid,
                    replicas=rng.randint(1, 4),
                    evidence="direct",
                    harm=Harm(
                        queue=rng.choice([0.0, 0.0, 2.0, 10.0]),
                        rate=rng.uniform(0.0, 5.0),
                    ),
                    offered_concurrency=rng.uniform(0.0, 20.0),
                )
            )
        elif d < 0.7:
            demand.append(DemandTarget(model_id=mid, replicas=1, evidence="inferred"))
    return profiles, demand


def make_input(n_hosts: int, n_models: int, seed: int) -> PlannerInput:
    rng = random.Random(f"{seed}:{n_hosts}:{n_models}")
    hosts = make_hosts(rng, n_hosts)
    profiles, demand = make_models(rng, n_models)
    return PlannerInput(
        now=NOW, profiles=tuple(profiles), hosts=tuple(hosts), demand=tuple(demand)
    )


def steady_input(inp: PlannerInput, cold_plan, seed: int) -> PlannerInput:
    """One tick later: the cold plan's replicas are live, cached and partly measured."""
    rng = random.Random(f"steady:{seed}:{len(inp.hosts)}:{len(inp.profiles)}")
    profiles = {p.model_id: p for p in inp.profiles}
    by_host: dict[str, list] = {}
    for pl in cold_plan.placements:
        by_host.setdefault(pl.host_id, []).append(pl)
    hosts = []
    for h in inp.hosts:
        mine = by_host.get(h.host_id, [])
        rs, cached, tps = [], [], {}
        for pl in mine:
            p = profiles[pl.model_id]
            state = "ready" if rng.random() < 0.85 else "warming"
            rs.append(
                ResidencyView(
                    model_id=pl.model_id,
                    memory_mb=pl.memory_mb,
                    state=state,
                    runtime=pl.runtime,
                    artifact_sha256=p.artifact_sha256,
                    loaded_at=NOW - rng.choice([60.0, 3_600.0]),
                    active_requests=rng.choice([0, 0, 1, 3]),
                )
            )
            cached.append(
                CachedArtifact(
                    model_id=pl.model_id,
                    sha256=p.artifact_sha256 or "",
                    size_bytes=(p.artifact_size_mb or 0) << 20,
                )
            )
            if rng.random() < 0.5:
                tps[pl.model_id] = rng.uniform(10.0, 200.0)
        hosts.append(
            HostView(
                host_id=h.host_id,
                state=h.state,
                resources=h.resources,
                residencies=tuple(rs),
                cached=tuple(cached),
                disk_free_bytes=h.disk_free_bytes,
                disk_total_bytes=h.disk_total_bytes,
                load=h.load,
                heartbeat_at=None if h.heartbeat_at is None else h.heartbeat_at + 15.0,
                measured_tokens_per_second=tps,
            )
        )
    # Demand grew a little for some models.
    demand = []
    for d in inp.demand:
        if rng.random() < 0.2:
            d = DemandTarget(
                model_id=d.model_id,
                replicas=d.replicas + 1,
                evidence=d.evidence,
                harm=d.harm,
                offered_concurrency=d.offered_concurrency,
            )
        demand.append(d)
    return PlannerInput(
        now=NOW + 15.0,
        profiles=inp.profiles,
        hosts=tuple(hosts),
        demand=tuple(demand),
        policy=inp.policy,
    )


def pending_input(inp: PlannerInput, cold_plan) -> PlannerInput:
    """A moment after the cold plan: its new placements are commanded, none loaded yet."""
    pairs = sorted({(p.host_id, p.model_id) for p in cold_plan.placements if p.status == "new"})
    return msgspec.structs.replace(
        inp, now=inp.now + 5.0, pending=tuple(PendingPlacement(host_id=h, model_id=m) for h, m in pairs)
    )


def against_times(tree: str, inputs: list[PlannerInput], repeat: int, clock: str) -> list[tuple[float, str]]:
    """(best seconds, plan sha256) per input, planned by the planner of source tree `tree`."""
    timer = Path(__file__).resolve().parent / "_plan_timer.py"
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        f.write(msgspec.json.encode(inputs))
        path = f.name
    try:
        env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()))
        out = subprocess.run(
            [sys.executable, str(timer), path, "--repeat", str(repeat), "--clock", clock],
            env=env, check=True, capture_output=True, text=True,
        ).stdout
    finally:
        os.unlink(path)
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    return [(r["seconds"], r["sha256"]) for r in rows]


def wave_input(n_hosts: int) -> PlannerInput:
    """bench.controller_tick's fleet and catalog, its first wave commanded (see the docstring)."""
    models = 32
    replicas = max(1, n_hosts // (2 * models))
    profiles = tuple(
        ModelProfile(model_id=f"model-{m:02d}.gguf", memory_mb=6000, min_replicas=replicas, max_replicas=replicas,
                     min_residency_seconds=0.0, scale_down_cooldown_seconds=0.0)
        for m in range(models)
    )
    hosts = tuple(
        HostView(
            host_id=f"host-{i:05d}", state="accepting",
            resources=HostResources(capacity_mb=32768, reserved_mb=2048, failure_domain=f"rack-{i % 16}",
                                    tags=("gpu",), gpu_count=1, gpu_memory_mb=24576),
            unmanaged_memory_mb=6000 if i % 2 == 0 else 0,
            disk_free_bytes=200 * GB, disk_total_bytes=500 * GB, heartbeat_at=NOW,
        )
        for i in range(n_hosts)
    )
    demand = tuple(DemandTarget(model_id=p.model_id, replicas=replicas, evidence="baseline", reason="min_replicas")
                   for p in profiles)
    cold = PlannerInput(now=NOW, profiles=profiles, hosts=hosts, demand=demand,
                        policy=Policy(heartbeat_timeout_seconds=600.0))
    return pending_input(cold, plan(cold))


def saturated_input(n_hosts: int, n_models: int) -> PlannerInput:
    hosts = tuple(
        HostView(
            host_id=f"host-{i:05d}",
            state="accepting",
            resources=HostResources(
                capacity_mb=8_192,
                failure_domain=f"rack-{i % max(4, n_hosts // 16):03d}",
            ),
            disk_free_bytes=256 * GB,
            heartbeat_at=NOW,
        )
        for i in range(n_hosts)
    )
    profiles = tuple(
        ModelProfile(
            model_id=f"model-{i:04d}.gguf",
            memory_mb=6_144,
            max_replicas=16,
            priority=i % 4,
        )
        for i in range(n_models)
    )
    demand = tuple(
        DemandTarget(model_id=p.model_id, replicas=16, evidence="direct")
        for p in profiles
    )
    return PlannerInput(now=NOW, profiles=profiles, hosts=hosts, demand=demand)


# Wall time by default; ``--clock cpu`` times process CPU instead (a shared, loaded machine).
CLOCK = time.perf_counter


def timed(fn, *args, repeat: int = 1):
    best = math.inf
    out = None
    for _ in range(repeat):
        t0 = CLOCK()
        out = fn(*args)
        best = min(best, CLOCK() - t0)
    return best, out


def slope(xs: list[float], ys: list[float]) -> float:
    lx = [math.log(x) for x in xs]
    ly = [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    num = sum((a - mx) * (b - my) for a, b in zip(lx, ly))
    den = sum((a - mx) ** 2 for a in lx)
    return num / den if den else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="only the smallest cells")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument(
        "--baseline-limit",
        type=int,
        default=512 * 128,
        help="max hosts*models for the full-scan baseline",
    )
    ap.add_argument("--hosts", default=None, help="host counts, comma-separated (overrides the grid's)")
    ap.add_argument("--models", default=None, help="model counts, comma-separated (overrides the grid's)")
    ap.add_argument("--against", default=None, help="another source tree whose planner to time on the same inputs")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="time wall (default) or process CPU")
    args = ap.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    hosts_axis = [64] if args.quick else [64, 512, 4096]
    models_axis = [32, 128] if args.quick else [32, 128, 512]
    if args.hosts:
        hosts_axis = [int(x) for x in args.hosts.split(",")]
    if args.models:
        models_axis = [int(x) for x in args.models.split(",")]
    print(
        f"{'hosts':>6} {'models':>6} {'phase':>7} {'wanted':>7} {'placed':>7} {'short':>6} {'preempt':>7} "
        f"{'seconds':>8} {'placements/s':>12} {'plan KB':>8} {'full-scan s':>11} {'ratio':>6}"
        + (f" {'against s':>9} {'speed-up':>8}" if args.against else "")
    )
    times: dict[tuple[int, int, str], float] = {}
    for n_models in models_axis:
        for n_hosts in hosts_axis:
            inp = make_input(n_hosts, n_models, args.seed)
            cold_t, cold = timed(plan, inp, repeat=args.repeat)
            steady = steady_input(inp, cold, args.seed)
            steady_t, st = timed(plan, steady, repeat=args.repeat)
            full = saturated_input(n_hosts, n_models)
            full_t, fp = timed(plan, full, repeat=args.repeat)
            pend = pending_input(inp, cold)
            pend_t, pp = timed(plan, pend, repeat=args.repeat)
            wave = wave_input(n_hosts)
            wave_t, wp = timed(plan, wave, repeat=args.repeat)
            phases = (
                ("cold", cold_t, cold, inp),
                ("steady", steady_t, st, steady),
                ("full", full_t, fp, full),
                ("pending", pend_t, pp, pend),
                ("wave", wave_t, wp, wave),
            )
            other = against_times(args.against, [x[3] for x in phases], args.repeat, args.clock) if args.against else None
            for k, (phase, t, p, i) in enumerate(phases):
                times[(n_models, n_hosts, phase)] = t
                wanted = sum(e.wanted for e in p.explanations)
                placed = sum(e.placed for e in p.explanations)
                data = encode_plan(p)
                base_s, ratio = "", ""
                if n_hosts * n_models <= args.baseline_limit:
                    bt, bp = timed(lambda x: build_plan(x, reference_scan=True), i)
                    assert encode_plan(bp) == data, "full scan and indexed plan differ"
                    base_s, ratio = f"{bt:.3f}", f"{bt / t:.1f}x"
                vs = ""
                if other is not None:
                    ot, osha = other[k]
                    assert osha == hashlib.sha256(data).hexdigest(), f"{phase}: the two trees' plans differ"
                    vs = f" {ot:>9.3f} {ot / t:>7.2f}x"
                print(
                    f"{n_hosts:>6} {n_models:>6} {phase:>7} {wanted:>7} {placed:>7} {len(p.shortfalls):>6} "
                    f"{len(p.preemptions):>7} {t:>8.3f} {len(p.placements) / t:>12.0f} {len(data) / 1024:>8.0f} "
                    f"{base_s:>11} {ratio:>6}{vs}",
                    flush=True,
                )
    if len(hosts_axis) > 1:
        print()
        for phase in ("cold", "steady", "full", "pending", "wave"):
            for n_models in models_axis:
                ys = [times[(n_models, h, phase)] for h in hosts_axis]
                print(
                    f"log-log slope of time in hosts ({phase}, {n_models} models): {slope(hosts_axis, ys):.2f}"
                )
        big = times.get((models_axis[-1], hosts_axis[-1], "cold"))
        big_s = times.get((models_axis[-1], hosts_axis[-1], "steady"))
        big_f = times.get((models_axis[-1], hosts_axis[-1], "full"))
        if big is not None:
            print(
                f"{hosts_axis[-1]} hosts x {models_axis[-1]} models: cold {big:.3f} s, steady {big_s:.3f} s, "
                f"saturated {big_f:.3f} s (goal < 2 s)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
