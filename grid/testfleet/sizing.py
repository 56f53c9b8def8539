"""How big a logical fleet is: the memory share of each machine, engine threads, the model.

Shares partition the machine (they never add up to more than it has), engines together do not
oversubscribe its CPUs, and every host's artifact cache is seeded from one verified copy.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from grid.agent.engines.llama_cpp import default_threads
from grid.config import GridConfig
from grid.testfleet.netns import MAX_HOSTS
from grid.testfleet.state import FleetError

MAX_MACHINES = MAX_HOSTS
DEFAULT_CAPACITY_MB = 2048
# Headroom beside the weights for a custom GGUF (KV cache of a 2k context, runtime buffers).
CUSTOM_MODEL_HEADROOM_MB = 400
# What the machine keeps for itself when the default shares are sized.
MACHINE_RESERVE_FRACTION = 0.2

Say = Callable[[str], None]


def engine_threads(machines: int, cpus: int | None = None) -> int:
    """Threads per engine so the fleet's engines together do not oversubscribe the machine
    (llama.cpp threads spin-wait: two engines fighting for one core both crawl): the cores one
    engine would take by default (all but one, left to the controller, the gateway and NATS),
    shared among the machines."""
    return max(1, default_threads(cpus) // machines)


def machine_memory_mb() -> int:
    return int(psutil.virtual_memory().total // (1024 * 1024))


def plan_capacities(machines: int, capacities_gib: tuple[float, ...] | None, model_memory_mb: int,
                    total_mb: int) -> tuple[int, ...]:
    """One capacity per logical host (MB), checked: shares are partitioned, never multiplied."""
    if not 1 <= machines <= MAX_MACHINES:
        raise FleetError(f"--machines must be 1..{MAX_MACHINES}, not {machines}")
    if capacities_gib is not None:
        if len(capacities_gib) != machines:
            raise FleetError(f"--capacities-gib lists {len(capacities_gib)} capacities for {machines} machines; "
                             "give one per machine")
        caps = tuple(int(round(c * 1024)) for c in capacities_gib)
    else:
        usable = int(total_mb * (1 - MACHINE_RESERVE_FRACTION))
        caps = (min(DEFAULT_CAPACITY_MB, usable // machines),) * machines
    for i, cap in enumerate(caps, start=1):
        if cap < model_memory_mb:
            raise FleetError(f"machine {i} would offer {cap} MB, less than one replica of the model "
                             f"({model_memory_mb} MB)")
    if sum(caps) > total_mb:
        raise FleetError(f"the capacities add up to {sum(caps)} MB but this machine has {total_mb} MB: "
                         "logical machines partition it, they never multiply it")
    return caps


# --- the model ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Model:
    model_id: str
    sha256: str
    blob: Path
    memory_mb: int


def prepare_model(root: Path, model: Path | None, say: Say) -> Model:
    from grid.agent.artifacts import BUNDLED_MODEL_ID, BUNDLED_SHA256, ArtifactCache, ensure_bundled_model, hash_file
    from grid.localgrid import BUNDLED_MEMORY_MB

    cfg = GridConfig(home=root / "models", nats_url=None)
    cfg.ensure_home()
    cache = ArtifactCache(cfg.artifacts_dir)
    if model is None:
        say("model: bundled SmolLM2 (verifying the cache)")
        blob = ensure_bundled_model(cfg)
        return Model(BUNDLED_MODEL_ID, BUNDLED_SHA256, blob, BUNDLED_MEMORY_MB)
    path = model.expanduser()
    if not path.is_file():
        raise FleetError(f"--model {path}: no such file")
    if not path.name.lower().endswith(".gguf"):
        raise FleetError(f"--model {path}: expected a .gguf file")
    say(f"model: hashing {path.name}")
    sha, size = hash_file(path)
    if not cache.has_blob(sha):
        outcome = cache.import_file(path, sha, model_id=path.name, source="testfleet")
        if not outcome.ok:
            raise FleetError(f"--model {path}: {outcome.message}")
    memory_mb = -(-size // (1024 * 1024)) + CUSTOM_MODEL_HEADROOM_MB
    return Model(path.name, sha, cache.blob_path(sha), memory_mb)


def seed_cache(home: Path, model: Model) -> None:
    """Put the model in a host's own cache (a hard link: no second copy on disk)."""
    from grid.agent.artifacts import ArtifactCache

    cache = ArtifactCache(GridConfig(home=home, nats_url=None).artifacts_dir)
    cache.ensure()
    target = cache.blob_path(model.sha256)
    if not target.exists():
        try:
            os.link(model.blob, target)
        except OSError:
            shutil.copyfile(model.blob, target)
    cache.register(model.model_id, model.sha256, target.stat().st_size)
