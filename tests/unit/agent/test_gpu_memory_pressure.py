"""GPU memory pressure is others' use of a GPU: the agent's own engines fill VRAM by design, so
their memory is subtracted; an own engine's unknown use gives no reading, never a guess.

The test machine has no GPU: nvidia-smi's output is recorded (tests/unit/agent/readings), NVML is
a fake module with nvidia-ml-py's API, and the real NVML (no library here) must read as None."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grid.agent import accelerators as acc
from grid.agent import sensors
from grid.agent.protection import (
    REASON_GPU_MEMORY_HIGH,
    ProtectionPolicy,
    ProtectionStatus,
    SensorSample,
    sensor_target,
    step,
)
from grid.agent.service import HostAgent
from grid.agent.state import ProcessProof, ResidencyRecord
from grid.config import GridConfig
from grid.events.log import InMemoryLog

READINGS = Path(__file__).parent / "readings"
MIB = 1024 * 1024

ENGINE_PID = 48213  # the llama.cpp engine in the recorded rtx4090x2 samples
OTHER_PID = 51877  # another job, on the second GPU
TOTAL_4090 = 24564


def reading(name: str) -> str:
    return (READINGS / name).read_text()


def recorded(memory: str, processes: str | None) -> tuple[acc.GpuMemory, ...]:
    gpus = acc.parse_nvidia_smi_gpu_memory(reading(memory))
    assert gpus is not None
    return acc.with_processes(gpus, None if processes is None else acc.parse_nvidia_smi_compute_apps(reading(processes)))


SERVER = ("nvidia-smi-memory-rtx4090x2.csv", "nvidia-smi-compute-apps-rtx4090x2.csv")
LAPTOP = ("nvidia-smi-memory-rtx4070-laptop.csv", "nvidia-smi-compute-apps-wddm.csv")


# --- parsing nvidia-smi's recorded output --------------------------------------------------------

def test_memory_query_gives_each_gpu_by_uuid() -> None:
    gpus = acc.parse_nvidia_smi_gpu_memory(reading(SERVER[0]))
    assert gpus == (acc.GpuMemory("GPU-5c7b3a8e-1f2d-4e6a-9b0c-7d8e9f0a1b2c", 23480, TOTAL_4090),
                    acc.GpuMemory("GPU-e41f9d02-8a7b-4c3d-b5e6-0f1a2b3c4d5e", 1024, TOTAL_4090))


def test_compute_apps_are_grouped_by_gpu() -> None:
    apps = acc.parse_nvidia_smi_compute_apps(reading(SERVER[1]))
    assert apps == {"GPU-5c7b3a8e-1f2d-4e6a-9b0c-7d8e9f0a1b2c": (acc.GpuProcess(ENGINE_PID, 22950),),
                    "GPU-e41f9d02-8a7b-4c3d-b5e6-0f1a2b3c4d5e": (acc.GpuProcess(OTHER_PID, 602),)}


def test_unreadable_process_memory_is_that_process_unknown() -> None:
    wddm = acc.parse_nvidia_smi_compute_apps(reading(LAPTOP[1]))
    assert wddm == {"GPU-0d1c2b3a-4f5e-4d6c-a7b8-9c0d1e2f3a4b": (acc.GpuProcess(7312, None), acc.GpuProcess(10344, None))}
    unsupported = acc.parse_nvidia_smi_compute_apps(reading("nvidia-smi-compute-apps-not-supported.csv"))
    assert unsupported is not None
    assert unsupported["GPU-5c7b3a8e-1f2d-4e6a-9b0c-7d8e9f0a1b2c"] == (acc.GpuProcess(ENGINE_PID, None),)


def test_no_compute_process_prints_nothing() -> None:
    assert acc.parse_nvidia_smi_compute_apps("") == {}
    assert acc.parse_nvidia_smi_compute_apps("\n") == {}


@pytest.mark.parametrize("text", [
    reading("nvidia-smi-compute-apps-truncated.csv"),
    "No running processes found\n",
    "Failed to initialize NVML: Driver/library version mismatch\n",
    "gpu_uuid, pid, used_gpu_memory [MiB]\n",  # a header: not the query we run
    "GPU-5c7b3a8e-1f2d-4e6a-9b0c-7d8e9f0a1b2c, -1, 100\n",
    "GPU-5c7b3a8e-1f2d-4e6a-9b0c-7d8e9f0a1b2c, 48213, 22950 GiB\n",
    "\x00\x01garbage,,,\n",
    'GPU-5c7b3a8e-1f2d-4e6a-9b0c-7d8e9f0a1b2c, "48213\n',
])
def test_garbled_process_list_is_no_list(text: str) -> None:
    assert acc.parse_nvidia_smi_compute_apps(text) is None


@pytest.mark.parametrize("text", [
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
    "23480, 24564\n",  # no UUID: the older query's output
    "GPU-5c7b3a8e-1f2d-4e6a-9b0c-7d8e9f0a1b2c, 23480\n",
    "GPU-5c7b3a8e-1f2d-4e6a-9b0c-7d8e9f0a1b2c, lots, 24564\n",
])
def test_garbled_memory_query_is_no_reading(text: str) -> None:
    assert acc.parse_nvidia_smi_gpu_memory(text) is None


def test_a_gpu_whose_memory_reads_na_gives_no_reading() -> None:
    gpus = acc.parse_nvidia_smi_gpu_memory(reading("nvidia-smi-memory-unreadable.csv"))
    assert gpus == ()
    assert acc.others_gpu_memory_percent(gpus, set()) is None


@given(st.text(max_size=300))
def test_the_parsers_never_raise(text: str) -> None:
    gpus = acc.parse_nvidia_smi_gpu_memory(text)
    apps = acc.parse_nvidia_smi_compute_apps(text)
    if gpus is not None:
        value = acc.others_gpu_memory_percent(acc.with_processes(gpus, apps), {1, 2})
        assert value is None or 0.0 <= value <= 100.0


# --- the rule: (used - own engines' use) / total on the fullest GPU ------------------------------

def test_own_engines_use_is_subtracted() -> None:
    gpus = recorded(*SERVER)
    # GPU 0: 23480 used, 22950 of them the engine's -> 530 others'; GPU 1: 1024 others'. The
    # fullest by others' use is GPU 1, though GPU 0 is 95.6% full.
    assert acc.others_gpu_memory_percent(gpus, {ENGINE_PID}) == pytest.approx(100.0 * 1024 / TOTAL_4090)


def test_without_own_engines_all_use_is_others() -> None:
    gpus = recorded(*SERVER)
    assert acc.others_gpu_memory_percent(gpus, set()) == pytest.approx(100.0 * 23480 / TOTAL_4090)
    # An engine of ours on no GPU (a CPU engine) subtracts nothing either.
    assert acc.others_gpu_memory_percent(gpus, {12345}) == pytest.approx(100.0 * 23480 / TOTAL_4090)


def test_an_own_engines_unknown_use_gives_no_reading_for_its_gpu() -> None:
    gpus = recorded(SERVER[0], "nvidia-smi-compute-apps-not-supported.csv")
    # GPU 0 holds our engine at an unknown figure: no opinion there; GPU 1 still reads.
    assert acc.others_gpu_memory_percent(gpus[:1], {ENGINE_PID}) is None
    assert acc.others_gpu_memory_percent(gpus, {ENGINE_PID}) == pytest.approx(100.0 * 1024 / TOTAL_4090)


def test_windows_wddm_unknowns_matter_only_for_our_own_engine() -> None:
    gpus = recorded(*LAPTOP)
    assert acc.others_gpu_memory_percent(gpus, {7312}) is None  # ours, figure unknown
    # Nothing of ours on it: the others' unknown figures do not matter, the device total does.
    assert acc.others_gpu_memory_percent(gpus, set()) == pytest.approx(100.0 * 7620 / 8188)
    assert acc.others_gpu_memory_percent(gpus, {999}) == pytest.approx(100.0 * 7620 / 8188)


def test_an_unreadable_process_list_is_unknown_only_while_engines_run() -> None:
    gpus = recorded(SERVER[0], None)
    assert all(g.processes is None for g in gpus)
    assert acc.others_gpu_memory_percent(gpus, {ENGINE_PID}) is None
    assert acc.others_gpu_memory_percent(gpus, set()) == pytest.approx(100.0 * 23480 / TOTAL_4090)


def test_the_fullest_gpu_by_others_use_decides() -> None:
    ours = acc.GpuProcess(pid=10, used_mb=7000)
    gpus = (acc.GpuMemory("GPU-a", used_mb=7800, total_mb=8000, processes=(ours,)),  # 10% others'
            acc.GpuMemory("GPU-b", used_mb=4000, total_mb=8000, processes=()),  # 50% others'
            acc.GpuMemory("GPU-c", used_mb=2000, total_mb=8000, processes=(acc.GpuProcess(11, 2000),)))  # 25%
    assert acc.others_gpu_memory_percent(gpus, {10}) == pytest.approx(50.0)


def test_a_process_listed_as_compute_and_graphics_counts_once() -> None:
    gpu = acc.GpuMemory("GPU-a", used_mb=6000, total_mb=8000,
                        processes=(acc.GpuProcess(10, 5000), acc.GpuProcess(10, 5000)))
    assert acc.others_gpu_memory_percent((gpu,), {10}) == pytest.approx(100.0 * 1000 / 8000)


def test_others_use_is_never_negative_and_misreads_give_nothing() -> None:
    # The list read a moment after the total: our engine shows more than the device did.
    late = acc.GpuMemory("GPU-a", used_mb=5000, total_mb=8000, processes=(acc.GpuProcess(10, 5200),))
    assert acc.others_gpu_memory_percent((late,), {10}) == 0.0
    assert acc.others_gpu_memory_percent((acc.GpuMemory("GPU-a", 9000, 8000, ()),), set()) is None
    assert acc.others_gpu_memory_percent((acc.GpuMemory("GPU-a", 0, 0, ()),), set()) is None
    assert acc.others_gpu_memory_percent((), {10}) is None


# --- protection: our own full GPU is no pressure, someone else's throttles ------------------------

CALM = dict(cpu_percent=10.0, memory_percent=40.0, temperature_c=50.0)
POLICY = ProtectionPolicy(debounce_samples=3, recovery_samples=3, recovery_cooldown_seconds=10.0)


def one_full_gpu(holder_pid: int) -> tuple[acc.GpuMemory, ...]:
    """A 24 GiB GPU 95% full, all of it held by `holder_pid` (a model sized to the GPU)."""
    return (acc.GpuMemory("GPU-a", used_mb=23336, total_mb=TOTAL_4090,
                          processes=(acc.GpuProcess(holder_pid, 23100),)),)


def sample_with(gpus: tuple[acc.GpuMemory, ...], own: set[int]) -> SensorSample:
    return SensorSample(**CALM, gpu_memory_percent=acc.others_gpu_memory_percent(gpus, own))


def states_over(sample: SensorSample, samples: int = 5) -> list[str]:
    status, states = ProtectionStatus(), []
    for now in range(samples):
        status, _ = step(POLICY, status, sample, None, float(now))
        states.append(status.state)
    return states


def test_a_gpu_filled_by_our_own_engine_is_no_pressure() -> None:
    sample = sample_with(one_full_gpu(ENGINE_PID), own={ENGINE_PID})
    assert sample.gpu_memory_percent is not None and sample.gpu_memory_percent < 1.0
    assert sensor_target(POLICY, sample, "accepting")[0] == "accepting"
    assert set(states_over(sample)) == {"accepting"}


def test_a_gpu_filled_by_someone_else_throttles() -> None:
    sample = sample_with(one_full_gpu(OTHER_PID), own={ENGINE_PID})
    assert sample.gpu_memory_percent == pytest.approx(100.0 * 23336 / TOTAL_4090)
    assert sensor_target(POLICY, sample, "accepting") == ("throttled", REASON_GPU_MEMORY_HIGH)
    assert states_over(sample)[-1] == "throttled"


def test_our_engines_unknown_use_is_no_opinion() -> None:
    unknown = (acc.GpuMemory("GPU-a", used_mb=23336, total_mb=TOTAL_4090,
                             processes=(acc.GpuProcess(ENGINE_PID, None),)),)
    sample = sample_with(unknown, own={ENGINE_PID})
    assert sample.gpu_memory_percent is None
    assert set(states_over(sample)) == {"accepting"}


# --- the sensor: NVML (a fake with nvidia-ml-py's API), nvidia-smi, and this machine's real path --

class FakeNVMLError(Exception):
    pass


@dataclass
class FakeGpu:
    uuid: str
    used_mb: int
    total_mb: int
    compute: list[tuple[int, int | None]]  # (pid, MiB or None)
    graphics: list[tuple[int, int | None]]
    lists_processes: bool = True


class FakeNvml:
    """The slice of nvidia-ml-py the sensor calls, with its shapes: memory in bytes, UUIDs as
    str, process entries with `pid` and `usedGpuMemory` (None when not available)."""

    NVMLError = FakeNVMLError

    def __init__(self, gpus: list[FakeGpu], init_fails: bool = False) -> None:
        self.gpus, self.init_fails, self.shutdowns = gpus, init_fails, 0

    def nvmlInit(self) -> None:
        if self.init_fails:
            raise FakeNVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, gpu: FakeGpu) -> str:
        return gpu.uuid

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(total=gpu.total_mb * MIB, used=gpu.used_mb * MIB,
                               free=(gpu.total_mb - gpu.used_mb) * MIB)

    def _processes(self, gpu: FakeGpu, listed: list[tuple[int, int | None]]) -> list[SimpleNamespace]:
        if not gpu.lists_processes:
            raise FakeNVMLError("Not Supported")
        return [SimpleNamespace(pid=pid, usedGpuMemory=None if mib is None else mib * MIB + 12345,
                                gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF) for pid, mib in listed]

    def nvmlDeviceGetComputeRunningProcesses(self, gpu: FakeGpu) -> list[SimpleNamespace]:
        return self._processes(gpu, gpu.compute)

    def nvmlDeviceGetGraphicsRunningProcesses(self, gpu: FakeGpu) -> list[SimpleNamespace]:
        return self._processes(gpu, gpu.graphics)


def never_run(argv: Sequence[str]) -> str | None:
    raise AssertionError(f"nvidia-smi must not run when nvidia-ml-py imports: {argv}")


def test_nvml_subtracts_our_engines_compute_and_graphics_use() -> None:
    # A CUDA engine (compute) on GPU 0 and a Vulkan engine (graphics) on GPU 1, beside a game.
    nvml = FakeNvml([FakeGpu("GPU-0", 23000, TOTAL_4090, compute=[(100, 22000)], graphics=[(7, 300)]),
                     FakeGpu("GPU-1", 20000, TOTAL_4090, compute=[], graphics=[(200, 12000), (8, 7000)])])
    value = sensors.gpu_memory_percent(lambda: {100, 200}, load=lambda: nvml, run=never_run)
    assert value == pytest.approx(100.0 * 8000 / TOTAL_4090)  # GPU 1: 20000 - 12000
    assert nvml.shutdowns == 1
    # The same machine seen by an agent running nothing: all of it is others' use.
    assert sensors.gpu_memory_percent(sensors.no_engines, load=lambda: nvml, run=never_run) == pytest.approx(
        100.0 * 23000 / TOTAL_4090)


def test_nvml_unknown_engine_use_or_unlisted_processes_give_no_reading() -> None:
    wddm = FakeNvml([FakeGpu("GPU-0", 7620, 8188, compute=[(100, None)], graphics=[(7, None)])])
    assert sensors.gpu_memory_percent(lambda: {100}, load=lambda: wddm) is None
    assert sensors.gpu_memory_percent(sensors.no_engines, load=lambda: wddm) == pytest.approx(100.0 * 7620 / 8188)
    unlisted = FakeNvml([FakeGpu("GPU-0", 7620, 8188, compute=[], graphics=[], lists_processes=False)])
    assert sensors.gpu_memory_percent(lambda: {100}, load=lambda: unlisted) is None


def test_nvml_without_a_driver_is_no_reading_and_no_nvidia_smi() -> None:
    nvml = FakeNvml([], init_fails=True)
    assert sensors.gpu_memory_percent(lambda: {100}, load=lambda: nvml, run=never_run) is None


def _no_nvml() -> object:
    raise ImportError("nvidia-ml-py is not installed")


def test_without_nvidia_ml_py_the_sensor_runs_both_nvidia_smi_queries() -> None:
    ran: list[tuple[str, ...]] = []
    answers = {sensors.NVIDIA_SMI_MEMORY_QUERY: reading(SERVER[0]), sensors.NVIDIA_SMI_PROCESS_QUERY: reading(SERVER[1])}

    def run(argv: Sequence[str]) -> str | None:
        ran.append(tuple(argv))
        return answers.get(tuple(argv))

    assert sensors.gpu_memory_percent(lambda: {ENGINE_PID}, load=_no_nvml, run=run) == pytest.approx(
        100.0 * 1024 / TOTAL_4090)
    assert ran == [("nvidia-smi", "--query-gpu=uuid,memory.used,memory.total", "--format=csv,noheader,nounits"),
                   ("nvidia-smi", "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits")]


def test_without_nvidia_ml_py_a_failed_or_garbled_nvidia_smi_is_unknown() -> None:
    def process_query_fails(argv: Sequence[str]) -> str | None:
        return reading(SERVER[0]) if tuple(argv) == sensors.NVIDIA_SMI_MEMORY_QUERY else None

    assert sensors.gpu_memory_percent(lambda: {ENGINE_PID}, load=_no_nvml, run=process_query_fails) is None
    assert sensors.gpu_memory_percent(lambda: {ENGINE_PID}, load=_no_nvml, run=lambda argv: None) is None
    assert sensors.gpu_memory_percent(lambda: {ENGINE_PID}, load=_no_nvml, run=lambda argv: "garbage\x00") is None


def test_this_machines_real_nvml_cannot_load_and_reads_none() -> None:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass  # no libnvidia-ml here: the real "no library" path
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    assert sensors.read_gpu_memory(run=never_run) == ()
    assert sensors.gpu_memory_percent(lambda: {ENGINE_PID}, run=never_run) is None
    assert sensors.PsutilSensors(own_engine_pids=lambda: {ENGINE_PID}).read().gpu_memory_percent is None


def test_psutil_sensors_pass_their_engine_pids_to_the_gpu_reading() -> None:
    def recorded_smi(argv: Sequence[str]) -> str | None:
        return reading(SERVER[0] if tuple(argv) == sensors.NVIDIA_SMI_MEMORY_QUERY else SERVER[1])

    ours = sensors.PsutilSensors(own_engine_pids=lambda: {ENGINE_PID},
                                 gpu_memory=lambda own: sensors.gpu_memory_percent(own, _no_nvml, recorded_smi))
    assert ours.read().gpu_memory_percent == pytest.approx(100.0 * 1024 / TOTAL_4090)
    nobodys = sensors.PsutilSensors(gpu_memory=lambda own: sensors.gpu_memory_percent(own, _no_nvml, recorded_smi))
    assert nobodys.read().gpu_memory_percent == pytest.approx(100.0 * 23480 / TOTAL_4090)


def test_the_agent_gives_its_sensors_the_pids_of_the_engines_it_runs(tmp_path: Path) -> None:
    agent = HostAgent(InMemoryLog(), GridConfig(home=tmp_path / "home", nats_url=None))
    asyncio.run(agent._open_sensors())
    assert isinstance(agent.sensors, sensors.PsutilSensors)
    assert agent.sensors.own_engine_pids() == frozenset()
    agent.state.residencies = {
        "a": ResidencyRecord(model_id="a", state="ready", process=ProcessProof(pid=ENGINE_PID, port=8101)),
        "b": ResidencyRecord(model_id="b", state="loading", process=ProcessProof(pid=4242, port=8102)),
        "c": ResidencyRecord(model_id="c", state="cached"),  # on disk, no process
    }
    assert agent.sensors.own_engine_pids() == {ENGINE_PID, 4242}
