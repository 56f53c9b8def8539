"""Local sensors behind one interface. Unknown is None, never zero.

`PsutilSensors` reads the real machine: CPU, RAM, temperature and battery through psutil, the
user's idle time through `grid.agent.user_idle`, and GPU memory pressure (others' use of a GPU:
`grid.agent.accelerators.others_gpu_memory_percent`) through NVML, or nvidia-smi when
nvidia-ml-py is missing, as the inventory does. `FixedSensors` is the injection seam for tests,
the scenario lab and `gridctl up` on a machine whose readings should be pinned: it returns
whatever sample it was last given.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Any, Protocol

import psutil

from grid.agent import accelerators as acc
from grid.agent.inventory import MIB, Runner, load_nvml, run_tool
from grid.agent.protection import SensorSample
from grid.agent.user_idle import UserIdle

NVIDIA_SMI_MEMORY_QUERY = ("nvidia-smi", f"--query-gpu={','.join(acc.NVIDIA_MEMORY_FIELDS)}",
                           "--format=csv,noheader,nounits")
NVIDIA_SMI_PROCESS_QUERY = ("nvidia-smi", f"--query-compute-apps={','.join(acc.NVIDIA_PROCESS_FIELDS)}",
                            "--format=csv,noheader,nounits")

# The PIDs of the engines this agent runs, read at every sample.
OwnEnginePids = Callable[[], Collection[int]]


def no_engines() -> frozenset[int]:
    """A sensor outside an agent (tests, `gridctl` reading the machine) runs no engine."""
    return frozenset()


class SensorSource(Protocol):
    def read(self) -> SensorSample: ...


class FixedSensors:
    def __init__(self, sample: SensorSample | None = None) -> None:
        self.sample = sample or SensorSample()

    def set(self, sample: SensorSample) -> None:
        self.sample = sample

    def read(self) -> SensorSample:
        return self.sample


def _max_temperature() -> float | None:
    reader = getattr(psutil, "sensors_temperatures", None)
    if reader is None:
        return None
    try:
        groups = reader()
    except (OSError, RuntimeError):
        return None
    values = [
        float(entry.current)
        for entries in groups.values()
        for entry in entries
        if entry.current is not None and entry.current > -100
    ]
    return max(values) if values else None


def nvml_processes(nvml: Any, handle: Any) -> tuple[acc.GpuProcess, ...] | None:
    """Every process holding memory on one GPU: compute (CUDA) and graphics (a desktop, a game,
    a Vulkan engine) alike. None when the driver will not list them (NotSupported)."""
    try:
        listed = [*nvml.nvmlDeviceGetComputeRunningProcesses(handle),
                  *nvml.nvmlDeviceGetGraphicsRunningProcesses(handle)]
    except nvml.NVMLError:
        return None
    # usedGpuMemory is bytes, or None when the driver does not say (Windows' WDDM).
    return tuple(acc.GpuProcess(pid=int(p.pid),
                                used_mb=None if p.usedGpuMemory is None else int(p.usedGpuMemory // MIB))
                 for p in listed)


def _nvml_gpu(nvml: Any, handle: Any) -> acc.GpuMemory:
    uuid = nvml.nvmlDeviceGetUUID(handle)
    mem = nvml.nvmlDeviceGetMemoryInfo(handle)
    return acc.GpuMemory(uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid), used_mb=int(mem.used // MIB),
                         total_mb=int(mem.total // MIB), processes=nvml_processes(nvml, handle))


def read_nvml_gpu_memory(nvml: Any) -> tuple[acc.GpuMemory, ...]:
    """Each NVIDIA GPU's memory and processes through NVML; () without a driver (NVML's library
    cannot load) or when the driver answers with an error."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return ()
    try:
        count = int(nvml.nvmlDeviceGetCount())
        return tuple(_nvml_gpu(nvml, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count))
    except nvml.NVMLError:
        return ()
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def read_nvidia_smi_gpu_memory(run: Runner = run_tool) -> tuple[acc.GpuMemory, ...]:
    """The same through nvidia-smi; () when it is missing, fails or prints something else.
    Its process list holds compute processes only. Others' use does not depend on it (see
    `others_gpu_memory_percent`), only our engines' entries must be there, and a CUDA engine is
    a compute process (a Vulkan engine is not listed: its use then counts as others', the
    cautious side)."""
    memory_text = run(NVIDIA_SMI_MEMORY_QUERY)
    gpus = None if memory_text is None else acc.parse_nvidia_smi_gpu_memory(memory_text)
    if not gpus:
        return ()
    process_text = run(NVIDIA_SMI_PROCESS_QUERY)
    processes = None if process_text is None else acc.parse_nvidia_smi_compute_apps(process_text)
    return acc.with_processes(gpus, processes)


def read_gpu_memory(load: Callable[[], Any] = load_nvml, run: Runner = run_tool) -> tuple[acc.GpuMemory, ...]:
    """NVML when nvidia-ml-py imports, else nvidia-smi (a driver install without the package)."""
    try:
        nvml = load()
    except ImportError:
        return read_nvidia_smi_gpu_memory(run)
    return read_nvml_gpu_memory(nvml)


def gpu_memory_percent(own_engine_pids: OwnEnginePids = no_engines, load: Callable[[], Any] = load_nvml,
                       run: Runner = run_tool) -> float | None:
    """GPU memory pressure: percent of the fullest NVIDIA GPU in use by anything but this
    agent's engines (`accelerators.others_gpu_memory_percent`); None without an NVIDIA GPU or
    when it cannot be read."""
    gpus = read_gpu_memory(load, run)
    # Our PIDs are read after the GPUs: an engine started in between is then already ours, not
    # counted as someone else's for a sample.
    return acc.others_gpu_memory_percent(gpus, own_engine_pids())


class PsutilSensors:
    """`own_engine_pids`: the engines the agent runs, whose GPU memory is not pressure on the
    host (see `gpu_memory_percent`); `gpu_memory` reads the pressure given them."""

    def __init__(self, *, user_idle: UserIdle | None = None, own_engine_pids: OwnEnginePids = no_engines,
                 gpu_memory: Callable[[OwnEnginePids], float | None] = gpu_memory_percent) -> None:
        psutil.cpu_percent(interval=None)  # prime: the first call has no interval to measure
        self.user_idle = user_idle or UserIdle()
        self.own_engine_pids = own_engine_pids
        self._gpu_memory = gpu_memory

    def read(self) -> SensorSample:
        cpu = psutil.cpu_percent(interval=None)
        memory = psutil.virtual_memory().percent
        battery_percent: float | None = None
        plugged: bool | None = None
        reader = getattr(psutil, "sensors_battery", None)
        if reader is not None:
            try:
                battery = reader()
            except (OSError, RuntimeError):
                battery = None
            if battery is not None:
                battery_percent = float(battery.percent)
                plugged = None if battery.power_plugged is None else bool(battery.power_plugged)
        return SensorSample(
            cpu_percent=float(cpu),
            memory_percent=float(memory),
            temperature_c=_max_temperature(),
            battery_percent=battery_percent,
            power_plugged=plugged,
            user_idle_seconds=self.user_idle.read(time.time()),
            gpu_memory_percent=self._gpu_memory(self.own_engine_pids),
        )
