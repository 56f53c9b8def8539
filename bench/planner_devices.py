"""Planner cost of per-device GPU memory: the same fleet planned with and without device readings.

A seeded fleet of GPU servers (1, 2, 4 or 8 CUDA devices of 24/48/80 GB each, a CUDA llama.cpp
build) and models of 2-60 GB, some declaring a 2-device tensor-parallel set. The baseline,
measured in the same run, is the same fleet with the device readings removed (the host's
RAM-sized capacity only, as before device-aware placement); the ratio is device time /
baseline time. Also printed: how many replicas each plan places (the device plan places only
what fits a device, the baseline overcommits devices it cannot see) and a check that no device
is overcommitted by the device plan.

    python bench/planner_devices.py            # 64, 256 and 1024 hosts
    python bench/planner_devices.py --quick    # 64 hosts
"""

from __future__ import annotations

import argparse
import math
import random
import time

import msgspec

from grid.events.control import ModelProfile
from grid.events.host import AcceleratorDevice, HostResources, RuntimeBuild
from grid.fleet.planning import PlannerInput, Policy, encode_plan
from grid.fleet.views import HostView
from grid.planner.plan import plan

NOW = 1_000_000.0


def make_input(n_hosts: int, n_models: int, seed: int) -> PlannerInput:
    rnd = random.Random(seed)
    hosts = []
    for i in range(n_hosts):
        n = rnd.choice([1, 2, 4, 8])
        size = rnd.choice([24_576, 49_152, 81_920])
        devices = tuple(
            AcceleratorDevice(kind="nvidia", index=d, backend="cuda", total_memory_mb=size,
                              free_memory_mb=size - rnd.choice([0, 0, 1_024, size // 4]), name="NVIDIA GPU")
            for d in range(n))
        res = HostResources(capacity_mb=n * size, runtimes=("llama.cpp",), backends=("cuda", "cpu"), gpu_count=n,
                            gpu_memory_mb=size, failure_domain=f"rack-{i % 8}", devices=devices,
                            runtime_builds=(RuntimeBuild(runtime="llama.cpp", backends=("cuda", "cpu")),))
        hosts.append(HostView(host_id=f"gpu-{i:05d}", state="accepting", resources=res, heartbeat_at=NOW - 1.0,
                              disk_free_bytes=1 << 40, disk_total_bytes=2 << 40))
    profiles = []
    for m in range(n_models):
        mem = rnd.choice([2_048, 6_144, 14_336, 30_720, 61_440])
        tp = 2 if mem >= 30_720 and rnd.random() < 0.3 else 0
        mn = rnd.choice([1, 1, 2, 4])
        profiles.append(ModelProfile(model_id=f"model-{m:04d}", memory_mb=mem, min_replicas=mn,
                                     max_replicas=mn, min_gpu_count=tp, priority=rnd.choice([0, 1, 2])))
    return PlannerInput(now=NOW, profiles=tuple(profiles), hosts=tuple(hosts), policy=Policy())


def without_devices(inp: PlannerInput) -> PlannerInput:
    hosts = tuple(msgspec.structs.replace(h, resources=msgspec.structs.replace(
        h.resources, devices=msgspec.UNSET, runtime_builds=msgspec.UNSET)) for h in inp.hosts)
    return msgspec.structs.replace(inp, hosts=hosts)


def timed(inp: PlannerInput, repeat: int):
    best = math.inf
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = plan(inp)
        best = min(best, time.perf_counter() - t0)
    return best, out


def overcommitted(inp: PlannerInput, p) -> int:
    """Devices whose new placements exceed their free memory (0 expected for the device plan)."""
    free = {(h.host_id, d.index): d.free_memory_mb for h in inp.hosts for d in h.resources.devices}
    used: dict[tuple[str, int], int] = {}
    for x in p.placements:
        if isinstance(x.devices, tuple):
            for d in x.devices:
                used[(x.host_id, d)] = used.get((x.host_id, d), 0) + math.ceil(x.memory_mb / len(x.devices))
    return sum(1 for k, v in used.items() if v > free[k])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="only the 64-host cell")
    ap.add_argument("--seed", type=int, default=7, help="fleet and model generator seed")
    ap.add_argument("--repeat", type=int, default=3, help="plans per measurement (the best is kept)")
    args = ap.parse_args(argv)
    print(f"{'hosts':>6} {'models':>6} {'devices s':>10} {'placed':>7} {'overcommit':>10} "
          f"{'baseline s':>10} {'placed':>7} {'ratio':>6}")
    for n_hosts in ([64] if args.quick else [64, 256, 1024]):
        n_models = n_hosts  # enough demand that device fit, not the sum of memory, binds
        inp = make_input(n_hosts, n_models, args.seed)
        dt, dp = timed(inp, args.repeat)
        base = without_devices(inp)
        bt, bp = timed(base, args.repeat)
        assert encode_plan(plan(inp)) == encode_plan(dp), "device plans are not deterministic"
        print(f"{n_hosts:>6} {n_models:>6} {dt:>10.3f} {len(dp.placements):>7} {overcommitted(inp, dp):>10} "
              f"{bt:>10.3f} {len(bp.placements):>7} {dt / bt:>5.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
