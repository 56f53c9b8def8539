"""Placement on hosts whose engines run on discrete GPUs: models fit a device's (or a declared
tensor-parallel set's) free memory, never the RAM figure; RAM-only runtimes still use RAM.

The reference checks are written from the rules (per-device sums over the plan's placements),
not from the planner's ledgers."""

from __future__ import annotations

import math

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec import UNSET

from grid.events.control import ModelProfile
from grid.events.host import AcceleratorDevice, RuntimeBuild
from grid.fleet import reasons as R
from grid.fleet.devices import vram_backend
from grid.fleet.planning import DemandTarget, PlannerInput, Policy, encode_plan
from grid.fleet.views import HostView, ResidencyView
from grid.planner.plan import build_plan, plan

from .builders import NOW, host, mk, on, prof

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MODELS = [f"m{i}" for i in range(6)]
LIVE = {"loading", "warming", "ready", "draining", "unloading"}
IMMOVABLE_REASONS = {R.EXTERNAL_RESIDENCY, R.PINNED_RESIDENCY}


def gpu_host(hid: str, ram: int, devices: list[tuple[int, int | None]], *, builds: tuple[str, ...] = ("cuda", "cpu"),
             residencies: tuple[ResidencyView, ...] = (), **kw) -> HostView:
    """A CUDA host: `devices` are (total, free) MiB; the llama.cpp build lists `builds`."""
    h = host(hid, ram, backends=("cuda", "cpu"), gpus=len(devices), gpu_mem=min(t for t, _ in devices),
             residencies=residencies, **kw)
    devs = tuple(AcceleratorDevice(kind="nvidia", index=i, backend="cuda", total_memory_mb=t, free_memory_mb=f,
                                   name="NVIDIA L4") for i, (t, f) in enumerate(devices))
    res = msgspec.structs.replace(h.resources, devices=devs,
                                  runtime_builds=(RuntimeBuild(runtime="llama.cpp", backends=builds),))
    return msgspec.structs.replace(h, resources=res)


def test_a_model_larger_than_ram_places_in_vram() -> None:
    p = plan(mk([prof("big", 20_000)], [gpu_host("g", 8_000, [(24_000, 24_000)]), host("cpu", 16_000)]))
    [x] = p.placements
    assert (x.host_id, x.devices) == ("g", (0,))


def test_a_model_must_fit_one_device_not_the_sum() -> None:
    # 2 x 16 GB: 20 GB fits the sum but no device; a declared 2-GPU set takes 10 GB on each.
    g = gpu_host("g", 64_000, [(16_000, 16_000), (16_000, 16_000)])
    p = plan(mk([prof("big", 20_000)], [g]))
    assert p.placements == () and any(s.model_id == "big" for s in p.shortfalls)
    p = plan(mk([prof("big", 20_000, min_gpu_count=2)], [g]))
    [x] = p.placements
    assert x.devices == (0, 1)


def test_devices_fill_by_best_fit_and_never_overflow() -> None:
    # Free memory differs per device (another process holds 10 GB of device 0).
    g = gpu_host("g", 4_000, [(24_000, 14_000), (24_000, 24_000)])
    profiles = [prof("a", 12_000), prof("b", 12_000), prof("c", 12_000)]
    exact = Policy(admission_headroom_fraction=0.0)
    p = plan(mk(profiles, [g], policy=exact))
    got = {x.model_id: x.devices for x in p.placements}
    assert sorted(got.values()) == [(0,), (1,), (1,)]
    p = plan(mk(profiles + [prof("d", 12_000)], [g], policy=exact))
    assert len(p.placements) == 3
    # With admission headroom a new engine needs 10% more free than its size: device 1 takes one.
    p = plan(mk(profiles, [g], policy=Policy(admission_headroom_fraction=0.1)))
    assert sorted(x.devices for x in p.placements) == [(0,), (1,)]


def test_incumbent_devices_count_once() -> None:
    # A ready 12 GB engine on device 1 (its memory already missing from the device's free
    # figure): device 1 has 12 GB left for desired work, device 0 all of its 24.
    r = ResidencyView(model_id="a", memory_mb=12_000, state="ready", loaded_at=NOW - 10_000, devices=(1,))
    g = gpu_host("g", 4_000, [(24_000, 24_000), (24_000, 12_000)], residencies=(r,))
    p = plan(mk([prof("a", 12_000), prof("b", 20_000), prof("c", 12_000)], [g],
                policy=Policy(admission_headroom_fraction=0.0)))
    got = {x.model_id: (x.status, x.devices) for x in p.placements}
    assert got == {"a": ("existing", (1,)), "b": ("new", (0,)), "c": ("new", (1,))}


def test_ram_only_runtime_and_cpu_build_stay_on_ram() -> None:
    # A CPU-only llama.cpp build on a GPU box: its engines run from RAM.
    cpu_build = gpu_host("g", 8_000, [(24_000, 24_000)], builds=("cpu",))
    assert vram_backend(cpu_build.resources) is None
    assert plan(mk([prof("big", 20_000)], [cpu_build])).placements == ()
    [x] = plan(mk([prof("small", 6_000)], [cpu_build])).placements
    assert x.devices is UNSET
    # A second runtime that cannot use CUDA keeps the whole host on its RAM ledger.
    mixed = gpu_host("m", 8_000, [(24_000, 24_000)], runtimes=("llama.cpp", "comfyui"))
    assert vram_backend(mixed.resources) is None


def test_gpu_less_plans_keep_their_bytes() -> None:
    inp = mk([prof("a", 4_000, min_replicas=2, max_replicas=2)], [host("h1"), host("h2")])
    data = encode_plan(plan(inp))
    assert b"devices" not in data and b"devices" not in msgspec.json.encode(inp)


# ---------------------------------------------------------------------------------------------
# Properties


@st.composite
def fleets(draw):
    hosts = []
    for i in range(draw(st.integers(1, 5))):
        domain = draw(st.sampled_from(["a", "b"]))
        ram = draw(st.sampled_from([4_000, 8_000, 16_000, 32_000]))
        if draw(st.integers(0, 3)) == 0:
            hosts.append(host(f"r{i}", ram, domain=domain, unmanaged=draw(st.sampled_from([0, 1_000]))))
            continue
        n = draw(st.integers(1, 4))
        devices = []
        for _ in range(n):
            total = draw(st.sampled_from([8_000, 16_000, 24_000]))
            devices.append((total, draw(st.sampled_from([total, total, total - 4_000, total // 2]))))
        rs = []
        for m in draw(st.lists(st.sampled_from(MODELS), max_size=3, unique=True)):
            mem = draw(st.sampled_from([2_000, 4_000, 6_000]))
            d = draw(st.integers(0, n - 1))
            t, f = devices[d]
            if f - mem < 0:
                continue
            devices[d] = (t, f - mem)  # a live engine's memory is gone from its device's free figure
            rs.append(ResidencyView(
                model_id=m, memory_mb=mem, state=draw(st.sampled_from(["ready", "ready", "warming", "draining"])),
                loaded_at=draw(st.sampled_from([NOW - 10_000, NOW - 10])), devices=(d,),
                managed=draw(st.integers(0, 5)) > 0, pinned=draw(st.integers(0, 9)) == 0,
            ))
        hosts.append(gpu_host(f"g{i}", ram, devices, residencies=tuple(rs), domain=domain,
                              state=draw(st.sampled_from(["accepting"] * 5 + ["throttled"])),
                              derating=draw(st.sampled_from([1.0, 1.0, 0.9]))))
    profiles = []
    for m in MODELS[: draw(st.integers(1, 6))]:
        mn = draw(st.integers(0, 3))
        profiles.append(ModelProfile(
            model_id=m, memory_mb=draw(st.sampled_from([2_000, 4_000, 6_000, 10_000, 20_000])),
            min_replicas=mn, max_replicas=max(mn, draw(st.integers(1, 4))), priority=draw(st.integers(0, 2)),
            min_gpu_count=draw(st.sampled_from([0, 0, 1, 2])), min_failure_domains=draw(st.integers(1, 2)),
        ))
    demand = [DemandTarget(model_id=p.model_id, replicas=draw(st.integers(0, 3)), evidence="direct")
              for p in profiles if draw(st.booleans())]
    policy = Policy(admission_headroom_fraction=draw(st.sampled_from([0.0, 0.1])),
                    max_evictions=draw(st.sampled_from([64, 1])))
    return PlannerInput(now=NOW, profiles=tuple(profiles), hosts=tuple(hosts), demand=tuple(demand), policy=policy)


def share(mem: int, n: int) -> int:
    return math.ceil(mem / n)


@SETTINGS
@given(fleets())
def test_never_overcommit_a_device(inp: PlannerInput) -> None:
    p = plan(inp)
    profiles = {x.model_id: x for x in inp.profiles}
    hh = inp.policy.admission_headroom_fraction
    for h in inp.hosts:
        mine = [x for x in p.placements if x.host_id == h.host_id]
        if vram_backend(h.resources) is None:
            assert all(x.devices is UNSET for x in mine)
            continue
        devices = {d.index: d for d in h.resources.devices}
        live = [r for r in h.residencies if r.state in LIVE]
        derating = h.resources.thermal_derating
        for x in mine:
            if x.status == "new":
                n = max(1, profiles[x.model_id].min_gpu_count)
                assert len(x.devices) == n and set(x.devices) <= set(devices)
        for i, d in devices.items():
            grid_on = sum(share(r.memory_mb, len(r.devices)) for r in live if i in r.devices)
            foreign = d.total_memory_mb - d.free_memory_mb - grid_on
            immovable = sum(share(r.memory_mb, len(r.devices)) for r in live
                            if i in r.devices and (not r.managed or r.pinned))
            desired = sum(share(x.memory_mb, len(x.devices)) for x in mine
                          if x.devices is not UNSET and i in x.devices and x.reason not in IMMOVABLE_REASONS
                          and x.reason != R.RETAINED_UNTIL_REPLACED)
            new = [share(x.memory_mb, len(x.devices)) for x in mine
                   if x.status == "new" and i in x.devices]
            if new:
                # (b) with new work on it, the complete desired footprint fits the derated
                # device beside foreign use (incumbents alone may predate a derating)
                assert foreign + immovable + desired <= int(d.total_memory_mb * derating)
                # (a) new engines fit what is physically free on the device now, with headroom
                assert sum(new) + hh * min(new) <= d.free_memory_mb + 1e-6
        # the RAM figure does not bound a VRAM host's placements, the devices do
        assert len({x.model_id for x in mine}) == len(mine)


@SETTINGS
@given(fleets())
def test_ram_hosts_still_use_ram(inp: PlannerInput) -> None:
    p = plan(inp)
    for h in inp.hosts:
        if vram_backend(h.resources) is not None:
            continue
        mine = [x for x in p.placements if x.host_id == h.host_id]
        cap = h.resources.capacity_mb - h.resources.reserved_mb
        if mine:
            assert h.unmanaged_memory_mb + sum(x.memory_mb for x in mine) <= cap


@SETTINGS
@given(fleets())
def test_device_plans_are_deterministic_and_exact(inp: PlannerInput) -> None:
    assert encode_plan(build_plan(inp, reference_scan=True)) == encode_plan(plan(inp)) == encode_plan(plan(inp))


def test_on_builder_still_reads_hosts() -> None:
    p = plan(mk([prof("a", 2_000)], [gpu_host("g", 1_000, [(8_000, 8_000)])]))
    assert on(p, "a") == ["g"]
