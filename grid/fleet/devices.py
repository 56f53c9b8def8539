"""Which memory a host's placements live in: its RAM, or its discrete accelerators' memory.

A host places in device memory (VRAM) when it reports discrete devices of one GPU backend and
every runtime it offers can use that backend (its reported build lists the backend; an agent
that reports no builds is taken at its host-wide `backends`). Apple's unified memory is the
RAM ledger already, and a host with any RAM-only runtime stays on RAM so that runtime's
models are never charged to a GPU. Pure functions of the reported resources.
"""

from __future__ import annotations

from grid.events.host import AcceleratorDevice, HostResources, devices_of, runtime_builds_of

DISCRETE_BACKENDS: frozenset[str] = frozenset({"cuda", "rocm", "vulkan"})


def discrete_devices(res: HostResources) -> tuple[AcceleratorDevice, ...]:
    return tuple(sorted((d for d in devices_of(res) if not d.unified and d.backend in DISCRETE_BACKENDS),
                        key=lambda d: d.index))


def vram_backend(res: HostResources) -> str | None:
    """The discrete backend this host's placements use, or None (RAM)."""
    return backend_of(res, discrete_devices(res))


def backend_of(res: HostResources, devices: tuple[AcceleratorDevice, ...]) -> str | None:
    """``vram_backend`` given the host's ``discrete_devices`` (callers that need both list the
    devices once: the planner asks for every host)."""
    if not devices or not res.runtimes:
        return None
    backend = devices[0].backend
    if any(d.backend != backend for d in devices):
        return None  # mixed vendors: which device a runtime uses is not known
    builds = {b.runtime: b.backends for b in runtime_builds_of(res)}
    for runtime in res.runtimes:
        usable = builds.get(runtime, res.backends if not builds else ())
        if backend not in usable:
            return None
    return backend


def vram_capacity_mb(res: HostResources) -> int:
    """Total memory of the discrete devices placements use (0 on a RAM host)."""
    devices = discrete_devices(res)
    if backend_of(res, devices) is None:
        return 0
    return sum(max(0, d.total_memory_mb) for d in devices)
