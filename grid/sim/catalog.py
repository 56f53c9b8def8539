"""The lab's model catalog: nine models of 1-30 GiB with 30 s-4 min startup, as ModelProfiles.

The first eight are the seed's standard set; `--models M` takes the first M. Scores say which
workloads a model is suitable for (the router's `auto` choice and the forecast read them).
"""

from __future__ import annotations

from dataclasses import dataclass

from grid.events.control import ModelProfile

GIB = 1024


@dataclass(frozen=True, slots=True)
class ModelSpec:
    model_id: str
    memory_mb: int
    load_seconds: float
    warm_seconds: float
    scores: tuple[tuple[str, float], ...]
    runtimes: tuple[str, ...] = ("llama.cpp",)
    backends: tuple[str, ...] = ()
    concurrency: int = 4
    expected_service_seconds: float = 4.0
    artifact_mb: int = 0
    min_replicas: int = 0
    max_replicas: int = 3
    priority: int = 0
    embeddings: bool = False

    @property
    def sha256(self) -> str:
        # Deterministic immutable identity: a lab artifact is named by its model id.
        import hashlib

        return hashlib.sha256(f"grid-sim-artifact:{self.model_id}".encode()).hexdigest()

    @property
    def startup_seconds(self) -> float:
        return self.load_seconds + self.warm_seconds


CATALOG: tuple[ModelSpec, ...] = (
    # The operations baseline: named directly by ops traffic and kept at one replica.
    ModelSpec("general-8b", 6 * GIB, 30.0, 20.0,
              (("general", 0.8), ("marketing", 0.6), ("sales", 0.6), ("research", 0.55), ("coding", 0.5),
               ("design", 0.45)), min_replicas=1, expected_service_seconds=3.0),
    ModelSpec("coder-14b", 10 * GIB, 60.0, 30.0, (("coding", 0.95), ("general", 0.4)),
              expected_service_seconds=5.0),
    ModelSpec("embed-small", 1 * GIB, 20.0, 10.0, (("embedding", 1.0),), concurrency=8,
              expected_service_seconds=0.3, embeddings=True),
    ModelSpec("writer-7b", 5 * GIB, 30.0, 20.0, (("marketing", 0.9), ("sales", 0.85), ("general", 0.5)),
              expected_service_seconds=3.0),
    ModelSpec("research-32b", 22 * GIB, 120.0, 60.0, (("research", 0.95), ("general", 0.7), ("marketing", 0.5)),
              concurrency=2, expected_service_seconds=8.0),
    ModelSpec("image-xl", 12 * GIB, 60.0, 60.0, (("image", 1.0), ("design", 0.5)), runtimes=("comfyui",),
              concurrency=1, expected_service_seconds=20.0),
    ModelSpec("video-gen", 30 * GIB, 120.0, 120.0, (("video", 1.0),), runtimes=("comfyui",), backends=("cuda",),
              concurrency=1, expected_service_seconds=90.0, max_replicas=2),
    ModelSpec("small-1b", int(1.5 * GIB), 20.0, 10.0, (("general", 0.5), ("sales", 0.4), ("design", 0.3)),
              concurrency=8, expected_service_seconds=1.5),
    ModelSpec("big-70b", 28 * GIB, 150.0, 90.0, (("general", 0.95), ("research", 0.9), ("coding", 0.85)),
              concurrency=2, expected_service_seconds=10.0, max_replicas=2),
)

MAX_MODELS = len(CATALOG)


def catalog(models: int) -> tuple[ModelSpec, ...]:
    if not 1 <= models <= MAX_MODELS:
        raise ValueError(f"--models must be between 1 and {MAX_MODELS}, got {models}")
    return CATALOG[:models]


def profile(spec: ModelSpec) -> ModelProfile:
    return ModelProfile(
        model_id=spec.model_id,
        memory_mb=spec.memory_mb,
        runtimes=spec.runtimes,
        backends=spec.backends,
        artifact_sha256=spec.sha256,
        artifact_source=f"sim://{spec.model_id}",
        artifact_size_mb=spec.artifact_mb or int(spec.memory_mb * 0.8),
        min_replicas=spec.min_replicas,
        max_replicas=spec.max_replicas,
        priority=spec.priority,
        workload_scores=dict(spec.scores),
        expected_service_seconds=spec.expected_service_seconds,
        replica_concurrency=spec.concurrency,
        load_seconds=spec.load_seconds,
        warm_seconds=spec.warm_seconds,
        embeddings=spec.embeddings,
    )
