"""What this machine has, and the share of it one agent offers to Grid.

Detection (side effects, at agent start): total and free RAM, GPUs with their VRAM and backend
(NVIDIA through `nvidia-ml-py` when a driver answers, else `nvidia-smi`; Apple Metal on Apple
silicon, read from `system_profiler` and `sysctl`; otherwise none), the runtimes actually
installed and the backends their build can use (`--list-devices`), bandwidth and compute
estimates, and the disk that holds the artifact cache. The text tools print is parsed by pure
functions in grid.agent.accelerators. A probe that finds nothing says why (a reason constant),
never raises: a machine without a GPU driver is an ordinary CPU host.

Capacity shares: several agents may run on one machine (a shared or partitioned box, the
logical fleet fixture). Each records the memory it offers in a machine-local ledger under the
grid home, and a new share is granted only if it fits beside the live ones, so N agents never
report more memory than the machine has. `capacity_share` is the pure decision; `claim_share`
takes a file lock, reads the ledger, decides and records.
"""

from __future__ import annotations

import fcntl
import os
import platform
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import psutil

from grid.agent import accelerators as acc
from grid.agent.engines.runtime import runtime_version
from grid.events.host import AcceleratorDevice, RuntimeBuild
from grid.procstart import same_start, start_stamp
from grid.secrets import open_owner_only

MIB = 1024 * 1024

BACKEND_CPU = acc.BACKEND_CPU
BACKEND_CUDA = acc.BACKEND_CUDA
BACKEND_METAL = acc.BACKEND_METAL
LLAMA_RUNTIME = "llama.cpp"
PROBE_TIMEOUT_SECONDS = 15.0

# Why a GPU probe found what it found.
GPU_FOUND = "gpu_found"
GPU_NO_LIBRARY = "no_gpu_library"  # nvidia-ml-py is not installed
GPU_NO_DRIVER = "no_gpu_driver"  # the library is there, the NVIDIA driver/NVML is not
GPU_NONE_FOUND = "no_gpu_found"  # a driver answered and reported zero devices
GPU_PROBE_FAILED = "gpu_probe_failed"  # the driver answered with an error
GPU_NOT_APPLE_SILICON = "not_apple_silicon"

# Why a capacity share was refused.
SHARE_EXCEEDS_MACHINE = "share_exceeds_machine"
SHARE_MACHINE_FULL = "machine_fully_shared"
SHARE_NOT_POSITIVE = "share_not_positive"

LEDGER_DIR = "capacity-shares"


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_mb: int
    backend: str
    free_mb: int | None = None
    unified: bool = False

    def device(self) -> AcceleratorDevice:
        kind = "apple" if self.backend == BACKEND_METAL else "nvidia"
        return AcceleratorDevice(kind=kind, index=self.index, backend=self.backend, total_memory_mb=self.memory_mb,
                                 free_memory_mb=self.free_mb, name=self.name, unified=self.unified)


@dataclass(frozen=True)
class GpuProbe:
    backend: str | None
    gpus: tuple[Gpu, ...]
    reason: str
    detail: str = ""


def _gpu(d: AcceleratorDevice) -> Gpu:
    return Gpu(d.index, d.name, d.total_memory_mb, d.backend, d.free_memory_mb, d.unified)


@dataclass(frozen=True)
class Inventory:
    total_memory_mb: int
    free_memory_mb: int
    cpu_count: int
    gpus: tuple[Gpu, ...]
    gpu_reason: str
    backends: tuple[str, ...]
    runtimes: tuple[str, ...]
    disk_total_bytes: int | None
    disk_free_bytes: int | None
    runtime_builds: tuple[RuntimeBuild, ...] = ()
    memory_bandwidth_gbps: float | None = None
    compute_gflops: float | None = None

    @property
    def devices(self) -> tuple[AcceleratorDevice, ...]:
        return tuple(g.device() for g in self.gpus)

    @property
    def unified_memory(self) -> bool:
        return any(g.unified for g in self.gpus)

    @property
    def engine_backend(self) -> str:
        """The backend a managed llama.cpp engine runs on: the GPU backend its build can use
        on a device this host has, else the CPU."""
        have = {g.backend for g in self.gpus}
        for build in self.runtime_builds:
            if build.runtime == LLAMA_RUNTIME:
                for backend in build.backends:
                    if backend in acc.GPU_BACKENDS and backend in have:
                        return backend
        return BACKEND_CPU

    @property
    def gpu_memory_mb(self) -> int:
        """VRAM a model may count on: the smallest GPU's (a model placed on this host is not
        split across GPUs), 0 without a GPU."""
        return min((g.memory_mb for g in self.gpus), default=0)


# --- GPU probes ---------------------------------------------------------------------------------


def load_nvml() -> Any:
    import pynvml  # nvidia-ml-py

    return pynvml


def probe_nvidia(load: Callable[[], Any] = load_nvml) -> GpuProbe:
    """NVIDIA GPUs through NVML. Without the library or the driver: a clear "no GPU" result."""
    try:
        nvml = load()
    except ImportError:
        return GpuProbe(None, (), GPU_NO_LIBRARY, "nvidia-ml-py is not installed")
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        # NVMLError_LibraryNotFound / DriverNotLoaded: no driver on this machine.
        return GpuProbe(None, (), GPU_NO_DRIVER, f"{type(exc).__name__}: {exc}")
    try:
        count = int(nvml.nvmlDeviceGetCount())
        gpus = []
        for i in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            name = nvml.nvmlDeviceGetName(handle)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(Gpu(i, name.decode() if isinstance(name, bytes) else str(name), int(mem.total // MIB),
                            BACKEND_CUDA, int(mem.free // MIB)))
    except nvml.NVMLError as exc:
        return GpuProbe(None, (), GPU_PROBE_FAILED, f"{type(exc).__name__}: {exc}")
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
    if not gpus:
        return GpuProbe(None, (), GPU_NONE_FOUND, "the NVIDIA driver reports no device")
    return GpuProbe(BACKEND_CUDA, tuple(gpus), GPU_FOUND)


Runner = Callable[[Sequence[str]], str | None]


def run_tool(argv: Sequence[str]) -> str | None:
    """A tool's stdout, or None when it is missing, fails or hangs."""
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=PROBE_TIMEOUT_SECONDS)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


NVIDIA_SMI_QUERY = ("nvidia-smi", "--query-gpu=index,name,memory.total,memory.free", "--format=csv")


def probe_nvidia_smi(run: Runner = run_tool) -> GpuProbe:
    """NVIDIA GPUs through nvidia-smi (a driver install without nvidia-ml-py)."""
    text = run(NVIDIA_SMI_QUERY)
    if text is None:
        return GpuProbe(None, (), GPU_NO_DRIVER, "nvidia-smi is missing or failed")
    devices = acc.parse_nvidia_smi_csv(text)
    if not devices:
        return GpuProbe(None, (), GPU_NONE_FOUND, "nvidia-smi reports no device")
    return GpuProbe(BACKEND_CUDA, tuple(_gpu(d) for d in devices), GPU_FOUND)


def probe_metal(system: str, machine: str, total_memory_mb: int, run: Runner | None = None) -> GpuProbe:
    """Apple silicon: the Metal GPU sharing the machine's unified memory (system_profiler and
    sysctl when `run` is given and answers; else one GPU named generically)."""
    if system != "Darwin" or machine != "arm64":
        return GpuProbe(None, (), GPU_NOT_APPLE_SILICON)
    if run is not None:
        profiler = run(("system_profiler", "SPDisplaysDataType", "-json"))
        memsize = run(("sysctl", "-n", "hw.memsize"))
        if profiler is not None and memsize is not None:
            devices = acc.parse_apple_displays(profiler, memsize)
            if devices:
                return GpuProbe(BACKEND_METAL, tuple(_gpu(d) for d in devices), GPU_FOUND)
    return GpuProbe(BACKEND_METAL, (Gpu(0, "Apple silicon GPU", total_memory_mb, BACKEND_METAL, None, True),),
                    GPU_FOUND)


def probe_gpus(total_memory_mb: int, *, system: str | None = None, machine: str | None = None,
               load_nvml: Callable[[], Any] = load_nvml, run: Runner = run_tool) -> GpuProbe:
    system = platform.system() if system is None else system
    machine = platform.machine() if machine is None else machine
    if system == "Darwin":
        return probe_metal(system, machine, total_memory_mb, run)
    probe = probe_nvidia(load_nvml)
    if probe.reason == GPU_NO_LIBRARY:
        return probe_nvidia_smi(run)
    return probe


def run_tool_text(argv: Sequence[str]) -> str | None:
    """A tool's whole output, stdout then stderr (llama-server prints --version on stderr), or
    None when it is missing, fails or hangs."""
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=PROBE_TIMEOUT_SECONDS)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout + out.stderr if out.returncode == 0 else None


def probe_runtime_build(command: Sequence[str] | None, run: Runner = run_tool,
                        run_text: Runner | None = None) -> RuntimeBuild | None:
    """The llama.cpp build behind `command` (llama-server, or the xllamacpp module which
    answers the same `--list-devices`), the backends it can use and its version. `run_text`
    reads a tool's whole output; without one, a given `run` (a test's recorded tools) answers
    for it too."""
    if not command:
        return None
    text = run((*command, "--list-devices"))
    devices = acc.parse_llama_list_devices(text) if text is not None else ()
    version = runtime_version(command, run_text or (run_tool_text if run is run_tool else run))
    return RuntimeBuild(runtime=LLAMA_RUNTIME, backends=acc.build_backends(devices), version=version)


def cpu_max_mhz() -> float | None:
    try:
        freq = psutil.cpu_freq()
    except (OSError, RuntimeError, NotImplementedError):
        return None
    if freq is None:
        return None
    return float(freq.max or freq.current or 0.0) or None


# --- the whole inventory -------------------------------------------------------------------------


def detect(*, llama_server: Path | None, disk_path: Path, gpu_probe: GpuProbe | None = None,
           runtime_command: Sequence[str] | None = None, run: Runner = run_tool) -> Inventory:
    """Everything at once (blocking: call it in a thread from async code). `runtime_command`
    is the runtime's argv prefix, asked for the devices its build can use."""
    vm = psutil.virtual_memory()
    total_mb = int(vm.total // MIB)
    probe = gpu_probe if gpu_probe is not None else probe_gpus(total_mb, run=run)
    backends = ((probe.backend,) if probe.backend else ()) + (BACKEND_CPU,)
    # Only what this agent can actually spawn (grid.agent.engines.llama_cpp needs the binary).
    runtimes = (LLAMA_RUNTIME,) if llama_server is not None and os.access(llama_server, os.X_OK) else ()
    build = probe_runtime_build(runtime_command, run) if runtimes else None
    cores = psutil.cpu_count(logical=False) or psutil.cpu_count() or 0
    bandwidth, gflops = acc.host_estimates(tuple(g.device() for g in probe.gpus), cores, cpu_max_mhz())
    disk_total = disk_free = None
    probe_path = disk_path
    while not probe_path.exists() and probe_path != probe_path.parent:
        probe_path = probe_path.parent
    try:
        usage = shutil.disk_usage(probe_path)
        disk_total, disk_free = int(usage.total), int(usage.free)
    except OSError:
        pass
    return Inventory(
        total_memory_mb=total_mb, free_memory_mb=int(vm.available // MIB), cpu_count=psutil.cpu_count() or 0,
        gpus=probe.gpus, gpu_reason=probe.reason, backends=backends, runtimes=runtimes,
        disk_total_bytes=disk_total, disk_free_bytes=disk_free,
        runtime_builds=(build,) if build is not None else (), memory_bandwidth_gbps=bandwidth, compute_gflops=gflops,
    )


# --- capacity shares -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ShareGranted:
    memory_mb: int


@dataclass(frozen=True)
class ShareRefused:
    reason: str
    message: str


def capacity_share(requested_mb: int | None, total_mb: int, others: Mapping[str, int]) -> ShareGranted | ShareRefused:
    """The memory one agent may offer beside the live shares of `others` (host id -> MB).

    An explicit request must fit in what the others left; without one the agent takes all of
    what is left. Either way the shares on one machine sum to at most its memory.
    """
    taken = sum(others.values())
    left = total_mb - taken
    holders = ", ".join(f"{h}={mb}" for h, mb in sorted(others.items())) or "none"
    if requested_mb is not None and requested_mb <= 0:
        return ShareRefused(SHARE_NOT_POSITIVE, f"--memory-mb must be positive, not {requested_mb}")
    if requested_mb is None:
        if left <= 0:
            return ShareRefused(SHARE_MACHINE_FULL,
                                f"this machine's {total_mb} MB are already offered by other agents ({holders}); "
                                "pass --memory-mb to the agents so their shares fit")
        return ShareGranted(left)
    if requested_mb > left:
        return ShareRefused(SHARE_EXCEEDS_MACHINE,
                            f"--memory-mb {requested_mb} does not fit: the machine has {total_mb} MB and other agents "
                            f"offer {taken} MB ({holders}), leaving {max(0, left)} MB")
    return ShareGranted(requested_mb)


class _Claim(msgspec.Struct, frozen=True):
    host_id: str
    memory_mb: int
    pid: int
    create_time: float
    start_stamp: str | None = None  # grid.procstart.start_stamp


class CapacityShareError(RuntimeError):
    """A share that does not fit; the message says what is taken and what to do."""

    def __init__(self, refusal: ShareRefused) -> None:
        super().__init__(refusal.message)
        self.reason = refusal.reason


@dataclass
class CapacityLedger:
    """The machine-local record of shares: one small file per host id, owner-only."""

    root: Path
    _mine: Path | None = field(default=None, init=False)

    @classmethod
    def under(cls, home: Path) -> CapacityLedger:
        return cls(home / LEDGER_DIR)

    def _live_claims(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for path in sorted(self.root.glob("*.json")):
            try:
                claim = msgspec.json.decode(path.read_bytes(), type=_Claim)
            except (OSError, msgspec.DecodeError, msgspec.ValidationError):
                continue  # damaged: ignored (its agent, if alive, rewrites it on restart)
            if _alive(claim):
                out[claim.host_id] = claim.memory_mb
        return out

    def claim(self, host_id: str, requested_mb: int | None, total_mb: int) -> int:
        """Record this agent's share and return it, or raise CapacityShareError."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open_owner_only(self.root / ".lock", "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            others = {h: mb for h, mb in self._live_claims().items() if h != host_id}
            decision = capacity_share(requested_mb, total_mb, others)
            if isinstance(decision, ShareRefused):
                raise CapacityShareError(decision)
            me = psutil.Process()
            path = self.root / f"{_file_token(host_id)}.json"
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(msgspec.json.encode(_Claim(host_id, decision.memory_mb, me.pid, me.create_time(),
                                                    start_stamp(me.pid))))
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
            self._mine = path
            return decision.memory_mb

    def release(self) -> None:
        if self._mine is not None:
            try:
                self._mine.unlink()
            except OSError:
                pass
            self._mine = None


def _file_token(host_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else f"%{ord(c):02x}" for c in host_id)[:200]


def _alive(claim: _Claim) -> bool:
    try:
        return same_start(claim.pid, psutil.Process(claim.pid).create_time(), recorded_stamp=claim.start_stamp,
                          recorded_create_time=claim.create_time, tolerance=1.0)
    except (psutil.Error, OSError):
        return False
