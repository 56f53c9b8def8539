"""Hardware inventory on this machine (CPU only, no NVIDIA driver) and capacity shares."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from grid.agent import inventory as inv
from grid.agent.engines.llama_cpp import find_llama_server
from grid.agent.heartbeat import host_resources
from grid.agent.options import AgentOptions


def test_nvidia_probe_without_a_driver_is_a_clear_no_gpu() -> None:
    # The real nvidia-ml-py, on a machine without the NVIDIA driver: NVML is not found.
    probe = inv.probe_nvidia()
    assert probe.backend is None and probe.gpus == ()
    assert probe.reason == inv.GPU_NO_DRIVER and "NVML" in probe.detail


def test_nvidia_probe_without_the_library_is_a_clear_no_gpu() -> None:
    def missing() -> object:
        raise ImportError("No module named 'pynvml'")

    assert inv.probe_nvidia(missing).reason == inv.GPU_NO_LIBRARY


def test_metal_only_on_apple_silicon() -> None:
    assert inv.probe_metal("Linux", "x86_64", 8000).reason == inv.GPU_NOT_APPLE_SILICON
    mac = inv.probe_metal("Darwin", "arm64", 16384)
    assert mac.backend == inv.BACKEND_METAL and [g.memory_mb for g in mac.gpus] == [16384]


def test_detect_reports_this_cpu_machine(tmp_path: Path) -> None:
    found = inv.detect(llama_server=find_llama_server(), disk_path=tmp_path / "not-yet" / "artifacts")
    vm = psutil.virtual_memory()
    assert found.total_memory_mb == vm.total // inv.MIB and 0 < found.free_memory_mb <= found.total_memory_mb
    assert found.gpus == () and found.gpu_reason == inv.GPU_NO_DRIVER and found.backends == ("cpu",)
    assert found.runtimes == (("llama.cpp",) if find_llama_server() else ())
    assert found.disk_total_bytes and found.disk_free_bytes is not None
    assert found.cpu_count == psutil.cpu_count()
    missing = inv.detect(llama_server=None, disk_path=tmp_path)
    assert missing.runtimes == ()

    res = host_resources(AgentOptions(tags=("a",), failure_domain="rack-1", data_tier="public"), capacity_mb=1234,
                         has_runtime=True, cpu_count=0, inventory=missing)
    assert (res.capacity_mb, res.runtimes, res.backends, res.gpu_count, res.gpu_memory_mb) == (1234, (), ("cpu",), 0, 0)
    assert (res.failure_domain, res.tags, res.data_tier, res.cpu_count) == ("rack-1", ("a",), "public", found.cpu_count)


def test_gpu_memory_is_the_smallest_gpus() -> None:
    gpus = (inv.Gpu(0, "a", 24000, "cuda"), inv.Gpu(1, "b", 16000, "cuda"))
    found = inv.Inventory(1, 1, 1, gpus, inv.GPU_FOUND, ("cuda", "cpu"), (), None, None)
    assert found.gpu_memory_mb == 16000


def test_capacity_share_partitions_never_multiplies() -> None:
    assert inv.capacity_share(None, 8000, {}) == inv.ShareGranted(8000)
    assert inv.capacity_share(3000, 8000, {"h1": 4000}) == inv.ShareGranted(3000)
    assert inv.capacity_share(None, 8000, {"h1": 3000, "h2": 2000}) == inv.ShareGranted(3000)
    refused = inv.capacity_share(5000, 8000, {"h1": 4000})
    assert isinstance(refused, inv.ShareRefused) and refused.reason == inv.SHARE_EXCEEDS_MACHINE
    assert "4000 MB" in refused.message and "h1=4000" in refused.message
    full = inv.capacity_share(None, 8000, {"h1": 8000})
    assert isinstance(full, inv.ShareRefused) and full.reason == inv.SHARE_MACHINE_FULL
    assert inv.capacity_share(0, 8000, {}).reason == inv.SHARE_NOT_POSITIVE  # type: ignore[union-attr]


def test_ledger_counts_live_agents_only(tmp_path: Path) -> None:
    total = 10_000
    a, b, c = (inv.CapacityLedger.under(tmp_path) for _ in range(3))
    assert a.claim("host-a", 4000, total) == 4000
    assert b.claim("host-b", None, total) == 6000  # what is left
    with pytest.raises(inv.CapacityShareError) as err:
        c.claim("host-c", 1, total)
    assert err.value.reason == inv.SHARE_MACHINE_FULL or err.value.reason == inv.SHARE_EXCEEDS_MACHINE
    assert a.claim("host-a", 3000, total) == 3000  # an agent's restart replaces its own share
    b.release()
    assert c.claim("host-c", 7000, total) == 7000
    assert sorted(p.stat().st_mode & 0o777 for p in (tmp_path / inv.LEDGER_DIR).glob("*.json")) == [0o600, 0o600]

    # A share whose agent died no longer counts.
    c.release()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        p = psutil.Process(proc.pid)
        dead = tmp_path / inv.LEDGER_DIR / "host-dead.json"
        dead.write_text(f'{{"host_id":"host-dead","memory_mb":5000,"pid":{proc.pid},"create_time":{p.create_time()}}}')
        with pytest.raises(inv.CapacityShareError):  # 3000 (host-a) + 5000 + 3000 > 10000
            inv.CapacityLedger.under(tmp_path).claim("host-d", 3000, total)
    finally:
        proc.kill()
        proc.wait()
    assert inv.CapacityLedger.under(tmp_path).claim("host-d", 3000, total) == 3000


def test_gridctl_node_start_refuses_bad_capacity_options(tmp_path: Path) -> None:
    env = dict(os.environ, GRID_HOME=str(tmp_path / "home"))
    for args, needle in ((["--data-tier", "secret"], "--data-tier"), (["--memory-mb", "0"], "--memory-mb")):
        out = subprocess.run([sys.executable, "-m", "grid.cli.main", "node", "start", "--nats", "nats://127.0.0.1:1",
                              *args], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and needle in out.stderr + out.stdout


def test_this_machines_runtimes_list_no_gpu_device(tmp_path: Path) -> None:
    # The real --list-devices of both runtimes on this CPU machine: a CPU-only build.
    from grid.agent.engines.runtime import xllamacpp_runtime

    # ...and each names its real version: the xllamacpp wheel's, llama-server's own --version.
    from importlib.metadata import version

    cpu_only = inv.RuntimeBuild(runtime="llama.cpp", backends=("cpu",), version=f"xllamacpp {version('xllamacpp')}")
    assert inv.probe_runtime_build(xllamacpp_runtime().command) == cpu_only
    native = find_llama_server()
    if native is not None:
        build = inv.probe_runtime_build((str(native),))
        assert build is not None and build.backends == ("cpu",) and build.version.startswith("b"), build
    found = inv.detect(llama_server=native or Path(sys.executable), disk_path=tmp_path,
                       runtime_command=xllamacpp_runtime().command)
    assert found.runtime_builds == (cpu_only,) and found.engine_backend == "cpu"
    assert found.compute_gflops is None or found.compute_gflops > 0
