"""Logical heterogeneous fleets: memory, disk, cached artifacts, concurrency, speed, runtimes and
backends, failure domains. Deterministic for a machine count (the seed varies the day, not the
hardware), so strategies and seeds compare on the same topology.
"""

from __future__ import annotations

from dataclasses import dataclass

from grid.events.host import HostResources

GIB = 1024
MAX_MACHINES = 64


@dataclass(frozen=True, slots=True)
class MachineSpec:
    host_id: str
    kind: str  # apple-metal | nvidia-cuda
    memory_mb: int
    disk_gb: int
    failure_domain: str
    runtimes: tuple[str, ...]
    backends: tuple[str, ...]
    # Relative throughput: service time divides by it.
    speed: float
    # Multiplies a model's replica concurrency on this machine.
    concurrency_factor: float
    # Artifact transfer rate for an uncached load.
    bandwidth_mb_s: float
    cached: tuple[str, ...] = ()

    def resources(self) -> HostResources:
        return HostResources(
            capacity_mb=self.memory_mb,
            reserved_mb=0,
            runtimes=self.runtimes,
            backends=self.backends,
            failure_domain=self.failure_domain,
            memory_bandwidth_gbps=400.0 * self.speed,
            compute_gflops=10_000.0 * self.speed,
            gpu_count=1 if self.kind == "nvidia-cuda" else 0,
            gpu_memory_mb=self.memory_mb if self.kind == "nvidia-cuda" else 0,
            cpu_count=8,
        )


_APPLE = (("llama.cpp", "comfyui"), ("metal", "mps"))
_NVIDIA = (("llama.cpp", "vllm", "comfyui"), ("cuda",))

# (kind, memory GiB, disk GiB, speed, concurrency factor, bandwidth MB/s)
_SCARCE: tuple[tuple[str, int, int, float, float, float], ...] = (
    ("apple-metal", 8, 128, 0.7, 1.0, 100.0),
    ("apple-metal", 16, 256, 1.0, 1.0, 200.0),
    ("nvidia-cuda", 24, 512, 1.6, 1.5, 400.0),
    ("apple-metal", 48, 1024, 1.2, 1.0, 200.0),
)
# The cycle larger fleets are built from.
_CYCLE: tuple[tuple[str, int, int, float, float, float], ...] = (
    ("apple-metal", 16, 256, 1.0, 1.0, 200.0),
    ("nvidia-cuda", 48, 1024, 1.8, 1.5, 400.0),
    ("apple-metal", 32, 512, 1.1, 1.0, 200.0),
    ("nvidia-cuda", 24, 512, 1.6, 1.5, 400.0),
    ("apple-metal", 64, 1024, 1.3, 1.0, 200.0),
    ("apple-metal", 8, 128, 0.7, 1.0, 100.0),
)


def build_fleet(machines: int) -> tuple[MachineSpec, ...]:
    """`machines` hosts in two failure domains. Four machines is the seed's scarce fixture
    (8/16/24/48 GiB); other sizes cycle a mixed Apple/NVIDIA set."""
    if not 1 <= machines <= MAX_MACHINES:
        raise ValueError(f"--machines must be between 1 and {MAX_MACHINES}, got {machines}")
    rows = _SCARCE if machines == 4 else tuple(_CYCLE[i % len(_CYCLE)] for i in range(machines))
    out = []
    for i, (kind, mem, disk, speed, cf, bw) in enumerate(rows):
        runtimes, backends = _NVIDIA if kind == "nvidia-cuda" else _APPLE
        out.append(MachineSpec(
            host_id=f"m{i:02d}", kind=kind, memory_mb=mem * GIB, disk_gb=disk,
            failure_domain="rack-a" if i % 2 == 0 else "rack-b", runtimes=runtimes, backends=backends,
            speed=speed, concurrency_factor=cf, bandwidth_mb_s=bw,
            # Every machine starts with the operations baseline and the embedder on disk.
            cached=("general-8b", "embed-small"),
        ))
    return tuple(out)
