"""One host's hardware as status shows it: accelerator, devices, VRAM, CPU, RAM, disk, runtimes.

A pure function of the reported resources (and disk readings), shared by `gridctl status`
(from heartbeats) and `gridctl node status` (from this machine's own inventory), so both show
the same fields with the same names.
"""

from __future__ import annotations

from typing import Any

from grid.events.host import HostResources, devices_of, runtime_builds_of
from grid.fleet.devices import vram_backend

GIB = 1 << 30


def hardware_row(res: HostResources, disk_free_bytes: int | None, disk_total_bytes: int | None) -> dict[str, Any]:
    devices = sorted(devices_of(res), key=lambda d: d.index)
    gpu = [d for d in devices if d.backend != "cpu"]
    vram = [d for d in gpu if not d.unified]
    if gpu:
        backend = gpu[0].backend
        names = sorted({d.name or d.kind for d in gpu})
        accelerator = f"{backend}: {len(gpu)}x {' / '.join(names)}" + (" (unified memory)" if gpu[0].unified else "")
    elif res.gpu_count:
        accelerator = f"{'/'.join(b for b in res.backends if b != 'cpu') or 'gpu'}: {res.gpu_count}x"
    else:
        accelerator = "cpu"
    builds = runtime_builds_of(res)
    runtimes = ([{"runtime": b.runtime, "backends": list(b.backends), "version": b.version} for b in builds]
                or [{"runtime": r, "backends": list(res.backends), "version": ""} for r in res.runtimes])
    return {
        "accelerator": accelerator,
        "placement_memory": "vram" if vram_backend(res) is not None else "ram",
        "devices": [
            {"index": d.index, "kind": d.kind, "name": d.name, "backend": d.backend,
             "total_memory_mb": d.total_memory_mb, "free_memory_mb": d.free_memory_mb, "unified": d.unified}
            for d in devices
        ],
        "vram_total_mb": sum(d.total_memory_mb for d in vram) if vram else None,
        "vram_free_mb": (sum(d.free_memory_mb for d in vram if d.free_memory_mb is not None)
                         if vram and all(d.free_memory_mb is not None for d in vram) else None),
        "unified_memory": bool(devices and any(d.unified for d in devices)),
        "cpu_count": res.cpu_count,
        "ram_mb": res.capacity_mb,
        "disk_free_bytes": disk_free_bytes,
        "disk_total_bytes": disk_total_bytes,
        "runtimes": runtimes,
        "memory_bandwidth_gbps": res.memory_bandwidth_gbps,
        "compute_gflops": res.compute_gflops,
    }


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:.0f}"


def hardware_cells(hw: dict[str, Any]) -> tuple[str, str, str, str, str, str, str]:
    """(accelerator, devices, VRAM, CPU, RAM, disk, runtimes) as table text."""
    devices = ", ".join(
        f"{d['index']}:{d['free_memory_mb'] if d['free_memory_mb'] is not None else '?'}/{d['total_memory_mb']}"
        for d in hw["devices"]) or "-"
    vram = "-" if hw["vram_total_mb"] is None else (
        f"{hw['vram_free_mb'] if hw['vram_free_mb'] is not None else '?'}/{hw['vram_total_mb']} MiB")
    if hw["unified_memory"]:
        vram = "unified"
    disk = "-" if hw["disk_total_bytes"] is None else f"{_gib(hw['disk_free_bytes'])}/{_gib(hw['disk_total_bytes'])} GiB"
    runtimes = ", ".join(f"{r['runtime']}({'+'.join(r['backends']) or '-'})" for r in hw["runtimes"]) or "-"
    return (hw["accelerator"], devices, vram, str(hw["cpu_count"] or "-"), f"{hw['ram_mb']} MiB", disk, runtimes)


HARDWARE_COLUMNS = ("accelerator", "devices free/total MiB", "VRAM", "CPU", "RAM", "disk free/total", "runtimes")
