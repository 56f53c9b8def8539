"""Accelerator readings parsed from recorded tool output, the devices an engine is started on,
and the engine command line carrying full offload exactly on a GPU backend."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from msgspec import UNSET

from grid.agent import accelerators as acc
from grid.agent import inventory as inv
from grid.agent.engines import llama_cpp
from grid.agent.engines.runtime import xllamacpp_runtime
from grid.agent.engines.xllamacpp_server import device_lines, parse_args
from grid.agent.heartbeat import host_resources
from grid.agent.options import AgentOptions
from grid.events.codec import encode_value
from grid.events.host import AcceleratorDevice, RuntimeBuild

READINGS = Path(__file__).parent / "readings"


def reading(name: str) -> str:
    return (READINGS / name).read_text()


def test_nvidia_smi_csv_with_header_and_units() -> None:
    devices = acc.parse_nvidia_smi_csv(reading("nvidia-smi-a100x2.csv"))
    assert [(d.index, d.total_memory_mb, d.free_memory_mb) for d in devices] == [(0, 81920, 81037), (1, 81920, 40211)]
    assert {(d.kind, d.backend, d.name, d.unified) for d in devices} == {
        ("nvidia", "cuda", "NVIDIA A100-SXM4-80GB", False)}


def test_nvidia_smi_csv_without_units_skips_an_unreadable_card() -> None:
    devices = acc.parse_nvidia_smi_csv(reading("nvidia-smi-rtx4090-nounits.csv"))
    assert [(d.index, d.name, d.total_memory_mb, d.free_memory_mb) for d in devices] == [
        (0, "NVIDIA GeForce RTX 4090", 24564, 23811)]
    assert acc.parse_nvidia_smi_csv("") == ()


def test_llama_list_devices_cuda_metal_and_cpu_builds() -> None:
    cuda = acc.parse_llama_list_devices(reading("llama-list-devices-cuda.txt"))
    assert [(d.index, d.backend, d.total_memory_mb, d.free_memory_mb) for d in cuda] == [
        (0, "cuda", 24135, 23768), (1, "cuda", 24135, 12001)]
    assert acc.build_backends(cuda) == ("cuda", "cpu")
    metal = acc.parse_llama_list_devices(reading("llama-list-devices-metal.txt"))
    assert [(d.kind, d.backend, d.unified, d.name) for d in metal] == [("apple", "metal", True, "Apple M2 Max")]
    assert acc.build_backends(metal) == ("metal", "cpu")
    assert acc.parse_llama_list_devices(reading("llama-list-devices-cpu.txt")) == ()
    assert acc.build_backends(()) == ("cpu",)


def test_xllamacpp_device_info_prints_llama_servers_format() -> None:
    gib = 1 << 30
    text = "\n".join(device_lines([
        {"name": "CPU", "description": "AMD EPYC", "memory_total": 8 * gib, "memory_free": 8 * gib},
        {"name": "CUDA0", "description": "NVIDIA L4", "memory_total": 23 * gib, "memory_free": 22 * gib},
    ]))
    [d] = acc.parse_llama_list_devices(text)
    assert (d.backend, d.index, d.name, d.total_memory_mb, d.free_memory_mb) == ("cuda", 0, "NVIDIA L4", 23552, 22528)
    assert device_lines([]) == ["Available devices:", "  (none)"]


def test_apple_silicon_reports_its_unified_memory() -> None:
    [gpu] = acc.parse_apple_displays(reading("system-profiler-displays-m2max.json"),
                                     reading("sysctl-hw-memsize-64g.txt"))
    assert (gpu.kind, gpu.backend, gpu.name, gpu.total_memory_mb, gpu.free_memory_mb, gpu.unified) == (
        "apple", "metal", "Apple M2 Max", 65536, None, True)
    assert acc.parse_apple_displays(reading("system-profiler-displays-intel-mac.json"),
                                    reading("sysctl-hw-memsize-64g.txt")) == ()
    assert acc.parse_apple_displays("not json", "1") == ()


def recorded(outputs: dict[str, str | None]) -> inv.Runner:
    """A runner that answers each tool with its recorded output (None: the tool is missing)."""
    def run(argv) -> str | None:
        return outputs.get(argv[0] if argv[0] != "llama-server" else "llama-server")
    return run


def test_probes_read_the_recorded_tools() -> None:
    def no_nvml() -> object:
        raise ImportError("No module named 'pynvml'")

    probe = inv.probe_gpus(1000, system="Linux", machine="x86_64", load_nvml=no_nvml,
                           run=recorded({"nvidia-smi": reading("nvidia-smi-a100x2.csv")}))
    assert probe.reason == inv.GPU_FOUND and probe.backend == "cuda"
    assert [(g.memory_mb, g.free_mb) for g in probe.gpus] == [(81920, 81037), (81920, 40211)]
    missing = inv.probe_gpus(1000, system="Linux", machine="x86_64", load_nvml=no_nvml, run=recorded({}))
    assert (missing.backend, missing.reason) == (None, inv.GPU_NO_DRIVER)

    mac = inv.probe_gpus(65536, system="Darwin", machine="arm64", run=recorded({
        "system_profiler": reading("system-profiler-displays-m2max.json"),
        "sysctl": reading("sysctl-hw-memsize-64g.txt")}))
    assert [(g.name, g.memory_mb, g.unified) for g in mac.gpus] == [("Apple M2 Max", 65536, True)]

    build = inv.probe_runtime_build(("llama-server",), recorded({"llama-server": reading("llama-list-devices-cuda.txt")}))
    assert build == RuntimeBuild(runtime="llama.cpp", backends=("cuda", "cpu"))
    assert inv.probe_runtime_build(("llama-server",), recorded({})) == RuntimeBuild(runtime="llama.cpp")


def cuda_inventory(build_backends: tuple[str, ...]) -> inv.Inventory:
    devices = acc.parse_nvidia_smi_csv(reading("nvidia-smi-a100x2.csv"))
    gpus = tuple(inv.Gpu(d.index, d.name, d.total_memory_mb, d.backend, d.free_memory_mb) for d in devices)
    bw, gf = acc.host_estimates(devices, 64, 3000.0)
    return inv.Inventory(515_000, 500_000, 128, gpus, inv.GPU_FOUND, ("cuda", "cpu"), ("llama.cpp",), None, None,
                         (RuntimeBuild(runtime="llama.cpp", backends=build_backends),), bw, gf)


def test_heartbeat_resources_carry_devices_builds_and_estimates() -> None:
    res = host_resources(AgentOptions(), capacity_mb=500_000, has_runtime=True, cpu_count=0,
                         inventory=cuda_inventory(("cuda", "cpu")))
    assert [(d.index, d.total_memory_mb, d.free_memory_mb) for d in res.devices] == [(0, 81920, 81037),
                                                                                      (1, 81920, 40211)]
    assert res.runtime_builds == (RuntimeBuild(runtime="llama.cpp", backends=("cuda", "cpu")),)
    assert (res.memory_bandwidth_gbps, res.compute_gflops) == (2039.0, 312_000.0)
    assert (res.gpu_count, res.gpu_memory_mb, res.unified_memory) == (2, 81920, UNSET)
    assert cuda_inventory(("cuda", "cpu")).engine_backend == "cuda"
    # A CPU-only build on a GPU host: engines run on the CPU, no offload.
    assert cuda_inventory(("cpu",)).engine_backend == "cpu"

    # A host with no GPU and no build detail says nothing new: its encoding keeps its bytes.
    plain = inv.Inventory(8000, 6000, 4, (), inv.GPU_NO_DRIVER, ("cpu",), ("llama.cpp",), None, None)
    res = host_resources(AgentOptions(), capacity_mb=8000, has_runtime=True, cpu_count=0, inventory=plain)
    assert b"devices" not in encode_value(res) and b"runtime_builds" not in encode_value(res)
    assert plain.engine_backend == "cpu"


def test_estimates_are_none_when_unknown() -> None:
    assert acc.host_estimates((), 8, 3500.0) == (None, 448.0)
    assert acc.host_estimates((), 8, None) == (None, None)
    odd = AcceleratorDevice(kind="nvidia", index=0, backend="cuda", total_memory_mb=1, name="Unknown Card")
    assert acc.host_estimates((odd,), 0, None) == (None, None)


def dev(i: int, free: int, total: int = 24000) -> AcceleratorDevice:
    return AcceleratorDevice(kind="nvidia", index=i, backend="cuda", total_memory_mb=total, free_memory_mb=free)


def test_engine_goes_to_the_best_fitting_device_and_splits_only_when_none_holds_it() -> None:
    devices = (dev(0, 20000), dev(1, 9000), dev(2, 12000))
    assert [d.index for d in acc.choose_devices(devices, "cuda", 8000)] == [1]
    assert [d.index for d in acc.choose_devices(devices, "cuda", 10000)] == [2]
    assert [d.index for d in acc.choose_devices(devices, "cuda", 30000)] == [0, 2]
    assert acc.choose_devices(devices, "cuda", 50000) is None
    assert acc.choose_devices(devices, "rocm", 1) is None
    assert acc.llama_device_name(devices[2]) == "CUDA2"


def spec(backend: str, devices: tuple[str, ...] = ()) -> llama_cpp.EngineSpec:
    return llama_cpp.EngineSpec(model_id="m", model_path=Path("m.gguf"), port=8080, key_file=Path("k"),
                                backend=backend, devices=devices)


def test_command_line_offloads_exactly_on_a_gpu_backend() -> None:
    for backend in ("cuda", "metal", "rocm", "vulkan"):
        argv = llama_cpp.build_argv(Path("/bin/llama-server"), spec(backend))
        i = argv.index("--n-gpu-layers")
        assert argv[i + 1] == str(llama_cpp.ALL_LAYERS) and "--device" not in argv
    argv = llama_cpp.build_argv(Path("/bin/llama-server"), spec("cuda", ("CUDA1",)))
    assert argv[argv.index("--device") + 1] == "CUDA1"
    cpu = llama_cpp.build_argv(Path("/bin/llama-server"), spec("cpu", ("CUDA1",)))
    assert "--n-gpu-layers" not in cpu and "--device" not in cpu and "-ngl" not in cpu


def test_xllamacpp_runtime_accepts_the_offload_flags() -> None:
    x = xllamacpp_runtime()
    args = parse_args(llama_cpp.build_argv(x.command, spec("cuda", ("CUDA0",)))[3:])
    assert (args.n_gpu_layers, args.device) == (llama_cpp.ALL_LAYERS, "CUDA0")
    args = parse_args(llama_cpp.build_argv(x.command, spec("cpu"))[3:])
    assert (args.n_gpu_layers, args.device) == (0, "")


@given(st.text(max_size=300))
def test_nvidia_smi_parser_never_raises(text: str) -> None:
    for device in acc.parse_nvidia_smi_csv(text):
        assert device.total_memory_mb is not None
