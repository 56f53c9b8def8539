"""Per-device memory ledgers of a host whose placements live in discrete GPU memory.

The host-level ledgers (state.py) count that memory as one sum; a model's weights, though,
must fit on one device (or, for a profile with `min_gpu_count` N > 1, a tensor-parallel set of
N devices holding 1/N each). ``DeviceLedger`` keeps, per device, the same two ledgers as the
host: ``free_a`` what is physically free now (the device's reported free memory minus this
plan's new placements; a new process needs its share with admission headroom) and ``free_b``
the desired footprint (device memory after thermal derating, minus memory Grid does not
own, immovable engines, kept incumbents, new placements and reservations).

Memory a residency occupies is charged to the devices it reports; a residency that reports
none is left inside the non-Grid figure, so it is never counted as free (conservative).
Device choice is best fit on ``free_b`` (ties: lower index), deterministic.
"""

from __future__ import annotations

import math

from grid.events.host import AcceleratorDevice, HostResources
from grid.fleet.devices import backend_of, discrete_devices
from grid.fleet.views import HostView, ResidencyView


def share_mb(memory_mb: int, n: int) -> int:
    return math.ceil(max(0, memory_mb) / max(1, n))


def residency_devices(r: ResidencyView, known: frozenset[int]) -> tuple[int, ...]:
    devices = () if not isinstance(r.devices, tuple) else r.devices
    return tuple(sorted({d for d in devices if d in known}))


class DeviceLedger:
    __slots__ = ("foreign_mb", "free_a", "free_b", "indexes")

    def __init__(self, indexes: tuple[int, ...], free_a: dict[int, int], free_b: dict[int, int],
                 foreign_mb: int = 0) -> None:
        self.indexes = indexes
        self.free_a = free_a
        self.free_b = free_b
        # Device memory in use by processes Grid does not own (all devices together).
        self.foreign_mb = foreign_mb

    @classmethod
    def for_host(cls, snap: HostView, live_states: frozenset[str]) -> DeviceLedger | None:
        """The ledger of a VRAM host before any incumbent is kept (None on a RAM host)."""
        res: HostResources = snap.resources
        devices: tuple[AcceleratorDevice, ...] = discrete_devices(res)
        if backend_of(res, devices) is None:
            return None
        known = frozenset(d.index for d in devices)
        derating = min(1.0, max(0.0, float(res.thermal_derating)))
        grid_on: dict[int, int] = {d.index: 0 for d in devices}
        immovable_on: dict[int, int] = {d.index: 0 for d in devices}
        for r in snap.residencies:
            if r.state not in live_states:
                continue
            on = residency_devices(r, known)
            for i in on:
                grid_on[i] += share_mb(r.memory_mb, len(on))
                if not r.managed or r.pinned:
                    immovable_on[i] += share_mb(r.memory_mb, len(on))
        free_a: dict[int, int] = {}
        free_b: dict[int, int] = {}
        foreign_total = 0
        for d in devices:
            free = d.total_memory_mb if d.free_memory_mb is None else d.free_memory_mb
            foreign = max(0, d.total_memory_mb - free - grid_on[d.index])
            foreign_total += foreign
            free_a[d.index] = free
            free_b[d.index] = int(d.total_memory_mb * derating) - foreign - immovable_on[d.index]
        return cls(tuple(d.index for d in devices), free_a, free_b, foreign_total)

    # -- choice -------------------------------------------------------------------------
    def pick(self, memory_mb: int, n: int, headroom: float | None) -> tuple[int, ...] | None:
        """Best-fit set of n devices for memory_mb (None: no such set). `headroom` None checks
        the desired ledger only (a reservation: the victims are still live)."""
        n = max(1, n)
        share = share_mb(memory_mb, n)
        need_a = math.ceil(share * (1.0 + headroom)) if headroom is not None else None
        fit = [i for i in self.indexes
               if self.free_b[i] >= share and (need_a is None or self.free_a[i] >= need_a)]
        if len(fit) < n:
            return None
        fit.sort(key=lambda i: (self.free_b[i], i))
        return tuple(sorted(fit[:n]))

    def fits(self, memory_mb: int, n: int, headroom: float) -> bool:
        # The feasibility check runs for every candidate host: count, do not sort.
        n = max(1, n)
        share = share_mb(memory_mb, n)
        need_a = math.ceil(share * (1.0 + headroom))
        free_a, free_b = self.free_a, self.free_b
        found = 0
        for i in self.indexes:
            if free_b[i] >= share and free_a[i] >= need_a:
                found += 1
                if found >= n:
                    return True
        return False

    def max_free(self) -> int:
        return max((min(self.free_a[i], self.free_b[i]) for i in self.indexes), default=0)

    # -- charges ------------------------------------------------------------------------
    def take(self, devices: tuple[int, ...], memory_mb: int, *, live: bool) -> None:
        """Charge memory_mb across `devices` to the desired ledger, and to the physical one
        when `live` (a new process this plan starts)."""
        share = share_mb(memory_mb, len(devices))
        for i in devices:
            self.free_b[i] -= share
            if live:
                self.free_a[i] -= share

    def give(self, devices: tuple[int, ...], memory_mb: int, *, live: bool) -> None:
        share = share_mb(memory_mb, len(devices))
        for i in devices:
            self.free_b[i] += share
            if live:
                self.free_a[i] += share

    def copy(self) -> DeviceLedger:
        return DeviceLedger(self.indexes, dict(self.free_a), dict(self.free_b), self.foreign_mb)
