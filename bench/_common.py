"""Shared benchmark helpers: a real embedded nats-server in a temp dir, timing, fleets."""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from grid.events.embedded import EmbeddedNats
from grid.events.host import HostHeartbeat, HostLoad, HostResources, Residency
from grid.events.requests import RequestFeatures


@contextlib.contextmanager
def embedded_server() -> Iterator[EmbeddedNats]:
    with tempfile.TemporaryDirectory(prefix="grid-bench-") as d:
        server = EmbeddedNats(Path(d))  # the real configuration: file store, sync_interval always
        server.start()
        try:
            yield server
        finally:
            server.stop()


class Timer:
    def __enter__(self) -> "Timer":
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start


def heartbeat(i: int, hosts: int = 256) -> HostHeartbeat:
    host = f"host-{i % hosts:04d}"
    return HostHeartbeat(
        event_id=f"hb-{i}",
        at=1_800_000_000.0 + i,
        host_id=host,
        resources=HostResources(capacity_mb=65536, reserved_mb=4096, backends=("cuda",), failure_domain=f"rack-{i % 8}",
                                tags=("gpu", "always-on"), gpu_count=1, gpu_memory_mb=24576),
        residencies=tuple(
            Residency(model_id=f"model-{(i + k) % 32}.gguf", memory_mb=8000, state="ready", loaded_age_seconds=600.0,
                      last_used_age_seconds=2.0, active_requests=k, max_concurrency=4, endpoint=f"http://10.0.0.{i % 250}:{20000 + k}")
            for k in range(3)
        ),
        disk_free_bytes=100 << 30,
        disk_total_bytes=500 << 30,
        load=HostLoad(active_tasks=2, queue_depth=1, cpu_percent=40.0),
    )


def request_record(i: int) -> RequestFeatures:
    return RequestFeatures(
        endpoint="chat", requested_model=f"model-{i % 32}.gguf", served_model=f"model-{i % 32}.gguf",
        host_id=f"host-{i % 256:04d}", input_units=100 + i % 50, output_units=40, workload="coding",
        service_seconds=0.2 + (i % 10) / 10, finished_at=1_800_000_000.0 + i / 1000,
    )


def median(xs: list[float]) -> float:
    return statistics.median(xs)
