"""build_heartbeat is a pure function of the agent's readings: same readings, same event."""

from __future__ import annotations

from grid.agent.heartbeat import build_heartbeat, host_resources
from grid.agent.options import AgentOptions
from grid.agent.state import ProcessProof, ResidencyRecord
from grid.events import codec
from grid.events.host import CachedArtifact


def _readings(**overrides):
    residencies = {
        "b-ready": ResidencyRecord(model_id="b-ready", state="ready", memory_mb=300, port=39001, slots=2,
                                   process=ProcessProof(pid=11, port=39001), loaded_at=900.0, last_used_at=990.0),
        "a-cached": ResidencyRecord(model_id="a-cached", state="cached", memory_mb=300, artifact_sha256="ab" * 32),
        "c-failed": ResidencyRecord(model_id="c-failed", state="failed", memory_mb=200, port=39002,
                                    process=ProcessProof(pid=12, port=39002)),
    }
    args = dict(
        event_id="e1", now=1000.0, host_id="h1", protection_state="throttled",
        resources=host_resources(AgentOptions(capacity_mb=4000), capacity_mb=4000, has_runtime=True, cpu_count=2),
        residencies=residencies, activity={"b-ready": 2}, managed_rss_mb=700, memory_used_mb=2000,
        cached=[CachedArtifact(model_id="a-cached", sha256="ab" * 32, size_bytes=10)],
        disk_free_bytes=5, disk_total_bytes=10, cpu_percent=12.5, highest_term=4, warnings=["w"],
    )
    args.update(overrides)
    return args


def test_same_readings_same_bytes_and_what_each_residency_reports():
    hb = build_heartbeat(**_readings())
    assert codec.encode(hb) == codec.encode(build_heartbeat(**_readings()))
    by_model = {r.model_id: r for r in hb.residencies}
    assert [r.model_id for r in hb.residencies] == ["a-cached", "b-ready", "c-failed"]
    ready, cached, failed = by_model["b-ready"], by_model["a-cached"], by_model["c-failed"]
    assert (ready.endpoint, ready.max_concurrency, ready.active_requests) == ("http://127.0.0.1:39001", 2, 2)
    assert (ready.loaded_age_seconds, ready.last_used_age_seconds) == (100.0, 10.0)
    # Only routed residencies advertise an endpoint; a failed child still holds its memory.
    assert (cached.memory_mb, cached.endpoint) == (0, None)
    assert (failed.memory_mb, failed.endpoint, failed.max_concurrency) == (200, None, None)
    assert hb.load.active_tasks == 2 and hb.unmanaged_memory_mb == 1300
    assert (hb.state, hb.highest_term, hb.warnings, hb.at) == ("throttled", 4, ("w",), 1000.0)
    assert build_heartbeat(**_readings(managed_rss_mb=5000)).unmanaged_memory_mb == 0


def test_a_gpu_engine_reports_its_devices_and_a_cpu_engine_adds_no_bytes():
    from msgspec import UNSET

    gpu = ResidencyRecord(model_id="g", state="ready", memory_mb=9000, port=39003, slots=1,
                          process=ProcessProof(pid=13, port=39003), loaded_at=900.0, devices=(1,))
    hb = build_heartbeat(**_readings(residencies={"g": gpu}, activity={}))
    assert [(r.model_id, r.devices) for r in hb.residencies] == [("g", (1,))]
    cpu = build_heartbeat(**_readings())
    assert all(r.devices is UNSET for r in cpu.residencies)
    assert b'"devices"' not in codec.encode(cpu)
