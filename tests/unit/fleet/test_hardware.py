"""The hardware columns of status, from resources built out of recorded readings."""

from __future__ import annotations

from pathlib import Path

from grid.agent import accelerators as acc
from grid.events.host import HostResources, RuntimeBuild
from grid.fleet.hardware import HARDWARE_COLUMNS, hardware_cells, hardware_row

READINGS = Path(__file__).parents[1] / "agent" / "readings"


def test_cuda_host_shows_devices_vram_and_builds() -> None:
    devices = acc.parse_nvidia_smi_csv((READINGS / "nvidia-smi-a100x2.csv").read_text())
    res = HostResources(capacity_mb=515_000, runtimes=("llama.cpp",), backends=("cuda", "cpu"), gpu_count=2,
                        gpu_memory_mb=81920, cpu_count=128, devices=devices,
                        runtime_builds=(RuntimeBuild(runtime="llama.cpp", backends=("cuda", "cpu")),))
    hw = hardware_row(res, 10 << 30, 100 << 30)
    assert hw["accelerator"] == "cuda: 2x NVIDIA A100-SXM4-80GB"
    assert (hw["placement_memory"], hw["vram_total_mb"], hw["vram_free_mb"]) == ("vram", 163840, 121248)
    cells = dict(zip(HARDWARE_COLUMNS, hardware_cells(hw)))
    assert cells == {
        "accelerator": "cuda: 2x NVIDIA A100-SXM4-80GB", "devices free/total MiB": "0:81037/81920, 1:40211/81920",
        "VRAM": "121248/163840 MiB", "CPU": "128", "RAM": "515000 MiB", "disk free/total": "10/100 GiB",
        "runtimes": "llama.cpp(cuda+cpu)",
    }


def test_apple_host_shows_unified_memory() -> None:
    devices = acc.parse_apple_displays((READINGS / "system-profiler-displays-m2max.json").read_text(),
                                       (READINGS / "sysctl-hw-memsize-64g.txt").read_text())
    res = HostResources(capacity_mb=65536, backends=("metal", "cpu"), gpu_count=1, gpu_memory_mb=65536,
                        cpu_count=12, devices=devices, unified_memory=True)
    hw = hardware_row(res, None, None)
    assert (hw["accelerator"], hw["placement_memory"], hw["unified_memory"]) == (
        "metal: 1x Apple M2 Max (unified memory)", "ram", True)
    assert hardware_cells(hw)[2] == "unified" and hardware_cells(hw)[5] == "-"


def test_host_without_hardware_detail() -> None:
    hw = hardware_row(HostResources(capacity_mb=4096, backends=("cpu",)), None, None)
    assert (hw["accelerator"], hw["devices"], hw["vram_total_mb"]) == ("cpu", [], None)
    assert hw["runtimes"] == [{"runtime": "llama.cpp", "backends": ["cpu"], "version": ""}]
    # An older agent that reported only a GPU count still shows it has one.
    old = hardware_row(HostResources(capacity_mb=4096, backends=("cuda", "cpu"), gpu_count=2), None, None)
    assert old["accelerator"] == "cuda: 2x"
