"""Accelerator readings, parsed by pure functions from the text real tools print.

Sources (each parsed here, each run by `grid.agent.inventory` with a timeout):

* `nvidia-smi --query-gpu=index,name,memory.total,memory.free --format=csv`: NVIDIA devices
  with total and free VRAM, in MiB;
* `llama-server --list-devices`: the devices a llama.cpp build can use ("CUDA0: NVIDIA ...
  (24080 MiB, 23651 MiB free)"), which is also what says whether the build has a GPU backend;
* `system_profiler SPDisplaysDataType -json` and `sysctl -n hw.memsize`: an Apple silicon GPU
  and the unified memory it shares with the CPU.

Memory bandwidth and compute are estimates: a table of published figures for common devices
(vendor spec sheets), and for CPUs cores x clock x 16 single-precision FLOPs per cycle (two
256-bit FMA units). Unknown devices give None, never zero, so the hardware prior leaves them out.
"""

from __future__ import annotations

import csv
import io
import json
import re

from grid.events.host import AcceleratorDevice

BACKEND_CPU = "cpu"
BACKEND_CUDA = "cuda"
BACKEND_METAL = "metal"
BACKEND_VULKAN = "vulkan"
BACKEND_ROCM = "rocm"

# Backends whose devices have their own memory (the planner fits models in it).
DISCRETE_BACKENDS: frozenset[str] = frozenset({BACKEND_CUDA, BACKEND_ROCM, BACKEND_VULKAN})
GPU_BACKENDS: frozenset[str] = DISCRETE_BACKENDS | {BACKEND_METAL}

# llama.cpp device-name prefixes ("CUDA0", "Metal", "Vulkan1", "ROCm0") -> backend.
_LLAMA_PREFIX = {"cuda": BACKEND_CUDA, "metal": BACKEND_METAL, "vulkan": BACKEND_VULKAN, "rocm": BACKEND_ROCM,
                 "hip": BACKEND_ROCM}
_BACKEND_KIND = {BACKEND_CUDA: "nvidia", BACKEND_METAL: "apple", BACKEND_ROCM: "amd", BACKEND_VULKAN: "vulkan"}

# (name fragment, memory bandwidth GB/s, dense FP16 tensor TFLOPS) from vendor spec sheets;
# the first matching fragment wins, so longer names come first.
_DEVICE_FIGURES: tuple[tuple[str, float, float], ...] = (
    ("H100 PCIe", 2000.0, 756.0),
    ("H100", 3350.0, 989.0),
    ("A100-SXM4-80GB", 2039.0, 312.0),
    ("A100 80GB PCIe", 1935.0, 312.0),
    ("A100", 1555.0, 312.0),
    ("L40S", 864.0, 362.0),
    ("L4", 300.0, 121.0),
    ("A10G", 600.0, 70.0),
    ("A10", 600.0, 125.0),
    ("T4", 320.0, 65.0),
    ("V100", 900.0, 125.0),
    ("RTX 4090", 1008.0, 165.0),
    ("RTX 4080", 717.0, 97.0),
    ("RTX 3090", 936.0, 71.0),
    ("RTX 3080", 760.0, 59.0),
    ("M3 Max", 400.0, 28.0),
    ("M3 Pro", 150.0, 14.0),
    ("M3", 100.0, 7.0),
    ("M2 Ultra", 800.0, 54.0),
    ("M2 Max", 400.0, 27.0),
    ("M2 Pro", 200.0, 13.6),
    ("M2", 100.0, 7.1),
    ("M1 Ultra", 800.0, 42.0),
    ("M1 Max", 400.0, 21.0),
    ("M1 Pro", 200.0, 10.4),
    ("M1", 68.0, 5.2),
)

CPU_FLOPS_PER_CYCLE = 16.0


def _int(text: str) -> int | None:
    m = re.search(r"-?\d+", text or "")
    return int(m.group()) if m else None


def parse_nvidia_smi_csv(text: str) -> tuple[AcceleratorDevice, ...]:
    """`nvidia-smi --query-gpu=index,name,memory.total,memory.free --format=csv` (with or
    without `noheader,nounits`). Lines that do not parse are skipped; "[N/A]" is unknown."""
    rows = [r for r in csv.reader(io.StringIO(text.strip()), skipinitialspace=True) if r and any(c.strip() for c in r)]
    if not rows:
        return ()
    cols = ["index", "name", "memory.total", "memory.free"]
    if rows[0] and rows[0][0].strip().lower() == "index":
        cols = [c.split("[")[0].strip().lower() for c in rows[0]]
        rows = rows[1:]
    out = []
    for row in rows:
        field = dict(zip(cols, (c.strip() for c in row)))
        index, total = _int(field.get("index", "")), _int(field.get("memory.total", ""))
        if index is None or total is None:
            continue
        out.append(AcceleratorDevice(kind="nvidia", index=index, backend=BACKEND_CUDA, total_memory_mb=total,
                                     free_memory_mb=_int(field.get("memory.free", "")), name=field.get("name", "")))
    return tuple(sorted(out, key=lambda d: d.index))


_LLAMA_DEVICE = re.compile(r"^\s*([A-Za-z]+)(\d*):\s+(.+?)\s*\((\d+)\s*MiB(?:,\s*(\d+)\s*MiB free)?\)\s*$")


def parse_llama_list_devices(text: str) -> tuple[AcceleratorDevice, ...]:
    """`llama-server --list-devices`: "Available devices:" then one "  CUDA0: NAME (T MiB, F MiB
    free)" line per device, or "  (none)" for a CPU-only build."""
    out = []
    for line in text.splitlines():
        m = _LLAMA_DEVICE.match(line)
        if m is None:
            continue
        backend = _LLAMA_PREFIX.get(m.group(1).lower())
        if backend is None:
            continue
        out.append(AcceleratorDevice(
            kind=_BACKEND_KIND[backend], index=int(m.group(2) or 0), backend=backend,
            total_memory_mb=int(m.group(4)), free_memory_mb=None if m.group(5) is None else int(m.group(5)),
            name=m.group(3), unified=backend == BACKEND_METAL,
        ))
    return tuple(out)


def build_backends(devices: tuple[AcceleratorDevice, ...]) -> tuple[str, ...]:
    """The backends a runtime build can use: its devices' plus the CPU, which every build has."""
    return tuple(sorted({d.backend for d in devices})) + (BACKEND_CPU,)


def parse_apple_displays(profiler_json: str, memsize_text: str) -> tuple[AcceleratorDevice, ...]:
    """`system_profiler SPDisplaysDataType -json` and `sysctl -n hw.memsize`: Apple silicon
    GPUs share the machine's memory, so each reports the whole of it and no free figure."""
    try:
        doc = json.loads(profiler_json)
    except ValueError:
        return ()
    memsize = _int(memsize_text)
    if memsize is None or memsize <= 0:
        return ()
    out = []
    for entry in doc.get("SPDisplaysDataType", []) if isinstance(doc, dict) else []:
        if not isinstance(entry, dict):
            continue
        if entry.get("spdisplays_vendor") != "sppci_vendor_Apple" and not str(entry.get("sppci_model", "")).startswith(
                "Apple M"):
            continue  # an eGPU or an Intel Mac's discrete GPU: not unified memory
        out.append(AcceleratorDevice(kind="apple", index=len(out), backend=BACKEND_METAL,
                                     total_memory_mb=memsize // (1024 * 1024), free_memory_mb=None,
                                     name=str(entry.get("sppci_model") or entry.get("_name") or ""), unified=True))
    return tuple(out)


def device_figures(name: str) -> tuple[float, float] | None:
    """(memory bandwidth GB/s, compute GFLOPS) for a known device name, else None."""
    for fragment, bw, tflops in _DEVICE_FIGURES:
        if fragment.lower() in name.lower():
            return bw, tflops * 1000.0
    return None


def host_estimates(devices: tuple[AcceleratorDevice, ...], cpu_cores: int,
                   cpu_max_mhz: float | None) -> tuple[float | None, float | None]:
    """(memory_bandwidth_gbps, compute_gflops) of the fastest device a model would run on:
    the best known GPU, else the CPU's compute (its memory bandwidth is not readable here)."""
    known = [f for f in (device_figures(d.name) for d in devices) if f is not None]
    if known:
        bw, gf = max(known)
        return bw, gf
    if cpu_cores > 0 and cpu_max_mhz and cpu_max_mhz > 0:
        return None, round(cpu_cores * cpu_max_mhz / 1000.0 * CPU_FLOPS_PER_CYCLE, 1)
    return None, None


_LLAMA_DEVICE_PREFIX = {BACKEND_CUDA: "CUDA", BACKEND_ROCM: "ROCm", BACKEND_VULKAN: "Vulkan"}


def llama_device_name(d: AcceleratorDevice) -> str:
    """The name llama.cpp's `--device` takes for a discrete device ("CUDA0")."""
    return f"{_LLAMA_DEVICE_PREFIX.get(d.backend, d.backend.upper())}{d.index}"


def device_free_mb(d: AcceleratorDevice) -> int:
    return d.total_memory_mb if d.free_memory_mb is None else d.free_memory_mb


def choose_devices(devices: tuple[AcceleratorDevice, ...], backend: str,
                   memory_mb: int) -> tuple[AcceleratorDevice, ...] | None:
    """The devices an engine of `memory_mb` loads onto: the one with the least free memory that
    still holds it whole (best fit keeps large devices for large models); only when none does,
    the fewest devices with the most free memory that hold it together (layers split across
    them). None when even all of them cannot."""
    pool = sorted((d for d in devices if d.backend == backend and not d.unified),
                  key=lambda d: (device_free_mb(d), d.index))
    for d in pool:
        if device_free_mb(d) >= memory_mb:
            return (d,)
    chosen: list[AcceleratorDevice] = []
    total = 0
    for d in sorted(pool, key=lambda d: (-device_free_mb(d), d.index)):
        chosen.append(d)
        total += device_free_mb(d)
        if total >= memory_mb:
            return tuple(sorted(chosen, key=lambda d: d.index))
    return None
