"""Accelerator readings, parsed by pure functions from the text real tools print.

Sources (each parsed here, each run by `grid.agent.inventory` with a timeout):

* `nvidia-smi --query-gpu=index,name,memory.total,memory.free --format=csv`: NVIDIA devices
  with total and free VRAM, in MiB (the inventory);
* `nvidia-smi --query-gpu=uuid,memory.used,memory.total` and `nvidia-smi
  --query-compute-apps=gpu_uuid,pid,used_memory` (both `--format=csv,noheader,nounits`): each
  GPU's memory in use and the processes holding it, for GPU memory pressure (the sensors read
  the same through NVML when nvidia-ml-py is installed);
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
import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

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


# The `--query-gpu` fields the inventory asks for, in its order (its output carries a header).
NVIDIA_INVENTORY_FIELDS: tuple[str, ...] = ("index", "name", "memory.total", "memory.free")


def _csv_rows(text: str) -> list[list[str]] | None:
    """The non-blank CSV rows of a tool's output, cells stripped; None when it is not CSV."""
    try:
        # Lines split first: a stray carriage return inside a line is garbage, not a csv.Error.
        rows = [r for r in csv.reader(text.strip().splitlines(), skipinitialspace=True)
                if r and any(c.strip() for c in r)]
    except csv.Error:
        return None
    return [[c.strip() for c in r] for r in rows]


def parse_nvidia_smi_csv(text: str) -> tuple[AcceleratorDevice, ...]:
    """`nvidia-smi --query-gpu=index,name,memory.total,memory.free --format=csv` (with or
    without `noheader,nounits`). Lines that do not parse are skipped; "[N/A]" is unknown."""
    rows = _csv_rows(text)
    if not rows:
        return ()
    cols = list(NVIDIA_INVENTORY_FIELDS)
    if rows[0][0].lower() == "index":
        cols = [c.split("[")[0].strip().lower() for c in rows[0]]
        rows = rows[1:]
    out = []
    for row in rows:
        field = dict(zip(cols, row))
        index, total = _int(field.get("index", "")), _int(field.get("memory.total", ""))
        if index is None or total is None:
            continue
        out.append(AcceleratorDevice(kind="nvidia", index=index, backend=BACKEND_CUDA, total_memory_mb=total,
                                     free_memory_mb=_int(field.get("memory.free", "")), name=field.get("name", "")))
    return tuple(sorted(out, key=lambda d: d.index))


# --- GPU memory pressure: the use of a GPU by processes other than the agent's engines -----------

# The sensors' per-sample queries, both `--format=csv,noheader,nounits`. nvidia-smi names a
# process's GPU by UUID only, so the memory query asks for the UUID to join the two.
NVIDIA_MEMORY_FIELDS: tuple[str, ...] = ("uuid", "memory.used", "memory.total")
NVIDIA_PROCESS_FIELDS: tuple[str, ...] = ("gpu_uuid", "pid", "used_memory")

_PID = re.compile(r"^[0-9]+$")
_GPU_UUID = re.compile(r"^(?:GPU|MIG)-[0-9A-Za-z-]+$")
_MIB = re.compile(r"^([0-9]+)(?:\s*MiB)?$")
# What nvidia-smi prints for a field it cannot read: "[N/A]", "[Not Supported]", "[Unknown Error]".
_UNREADABLE = re.compile(r"^\[[^\]]*\]$")


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU, MiB. `used_mb` None: the driver does not say (Windows'
    WDDM driver, "[N/A]", "[Not Supported]")."""

    pid: int
    used_mb: int | None


@dataclass(frozen=True)
class GpuMemory:
    """One NVIDIA GPU's memory at one sample, MiB. `processes`: the ones the driver lists as
    holding memory on it; None when they could not be listed."""

    uuid: str
    used_mb: int
    total_mb: int
    processes: tuple[GpuProcess, ...] | None = None


def _mib(cell: str) -> int | None:
    m = _MIB.match(cell)
    return int(m.group(1)) if m else None


def parse_nvidia_smi_gpu_memory(text: str) -> tuple[GpuMemory, ...] | None:
    """`nvidia-smi --query-gpu=uuid,memory.used,memory.total --format=csv,noheader,nounits`:
    one reading per GPU (a GPU whose memory reads "[N/A]" gives none). None when the output is
    not that query's: an error message or garbage is no reading, never an empty machine."""
    rows = _csv_rows(text)
    if rows is None:
        return None
    out = []
    for row in rows:
        if len(row) != len(NVIDIA_MEMORY_FIELDS) or not _GPU_UUID.match(row[0]):
            return None
        if any(_mib(c) is None and not _UNREADABLE.match(c) for c in row[1:]):
            return None
        used, total = _mib(row[1]), _mib(row[2])
        if used is not None and total is not None:
            out.append(GpuMemory(uuid=row[0], used_mb=used, total_mb=total))
    return tuple(out)


def parse_nvidia_smi_compute_apps(text: str) -> dict[str, tuple[GpuProcess, ...]] | None:
    """`nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits`:
    each GPU's processes by UUID (no output: no process anywhere). A used_memory of "[N/A]" or
    "[Not Supported]" makes that process's use unknown. None when the output is not that
    query's: a list that cannot be read is not an empty one."""
    rows = _csv_rows(text)
    if rows is None:
        return None
    out: dict[str, list[GpuProcess]] = {}
    for row in rows:
        if len(row) != len(NVIDIA_PROCESS_FIELDS) or not _GPU_UUID.match(row[0]) or not _PID.match(row[1]):
            return None
        used = _mib(row[2])
        if used is None and not _UNREADABLE.match(row[2]):
            return None
        out.setdefault(row[0], []).append(GpuProcess(pid=int(row[1]), used_mb=used))
    return {uuid: tuple(procs) for uuid, procs in out.items()}


def with_processes(gpus: tuple[GpuMemory, ...],
                   processes: Mapping[str, tuple[GpuProcess, ...]] | None) -> tuple[GpuMemory, ...]:
    """Each GPU with its processes (a GPU nobody holds memory on: none); `processes` None (the
    list could not be read): every GPU's processes unknown."""
    return tuple(GpuMemory(uuid=g.uuid, used_mb=g.used_mb, total_mb=g.total_mb,
                           processes=None if processes is None else processes.get(g.uuid, ()))
                 for g in gpus)


def _own_use_mb(gpu: GpuMemory, own_pids: Collection[int]) -> int | None:
    """MiB the agent's own engines hold on `gpu`; None when that cannot be known (the list is
    unreadable while engines run, or an engine's own figure is unknown)."""
    if not own_pids:
        return 0  # no engine of ours anywhere: nothing to subtract, whatever the list says
    if gpu.processes is None:
        return None
    use: dict[int, int] = {}
    for p in gpu.processes:
        if p.pid not in own_pids:
            continue
        if p.used_mb is None:
            return None
        # A process with compute and graphics contexts is listed twice, with the same figure.
        use[p.pid] = max(use.get(p.pid, 0), p.used_mb)
    return sum(use.values())


def _others_percent(gpu: GpuMemory, own_pids: Collection[int]) -> float | None:
    if gpu.total_mb <= 0 or not 0 <= gpu.used_mb <= gpu.total_mb:
        return None  # a zero total or more used than there is: a misread, not pressure
    own = _own_use_mb(gpu, own_pids)
    if own is None:
        return None
    # At least zero: the device total and the process list are read at different moments.
    return 100.0 * max(0, gpu.used_mb - own) / gpu.total_mb


def others_gpu_memory_percent(gpus: Iterable[GpuMemory], own_pids: Collection[int]) -> float | None:
    """GPU memory pressure: the percent of the fullest GPU's memory in use by anything but the
    agent's own engines (`own_pids`); None when no GPU gives a reading.

    Per GPU it is (used - own engines' use) / total. Grid's engines fill a GPU by design (a
    model sized to it), so total use would throttle every busy GPU server for good; what a host
    must yield to is everyone else's use: a user's game, another team's job, an external engine
    the host declared. Others' use is the device total minus ours, not a sum over the other
    processes, because not every holder is listed (nvidia-smi omits graphics processes, the
    driver's own reservation is nobody's). A GPU where an own engine's use is unknown gives no
    reading rather than a guess. The fullest GPU, not the average: one full GPU is enough for
    the next allocation on it to fail."""
    readings = [r for r in (_others_percent(g, own_pids) for g in gpus) if r is not None]
    return max(readings) if readings else None


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
