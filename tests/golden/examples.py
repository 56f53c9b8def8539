"""One example per event tag, used once to freeze tests/golden/events/<tag>.json.

Golden files are never edited: if an event changes shape, add a new version and an upcaster.
Run `python -m tests.golden.examples` to write files for new tags only.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from grid.events import codec
from grid.events.acks import ActionAck
from grid.events.base import Event
from grid.events.commands import CommandIssued, CommandWithdrawn
from grid.events.control import (
    CredentialRevoked,
    ForecastWindowSet,
    HostOverride,
    ModelProfile,
    ModeSet,
    ProfileRemoved,
    ProfileSet,
    RouteAdmitted,
    RouteWithdrawn,
    TickRequested,
)
from grid.events.evaluations import EvaluationRecorded
from grid.events.host import (
    CachedArtifact,
    HostHeartbeat,
    HostLoad,
    HostRegistered,
    HostResources,
    ProtectionTransition,
    QualificationRecorded,
    QualificationStep,
    Residency,
)
from grid.events.plan import PlanCreated
from grid.events.requests import RequestBatch, RequestCompleted, RequestFailed, RequestFeatures

SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
RES = HostResources(capacity_mb=24576, reserved_mb=2048, backends=("cpu",), failure_domain="rack-1", tags=("employee",), cpu_count=2)
FEATURES = RequestFeatures(
    endpoint="chat", requested_model=MODEL, served_model=MODEL, host_id="host-1", input_units=12, output_units=8,
    workload="coding", service_seconds=0.42, queue_seconds=0.01, outcome="ok", status_code=200, finished_at=1_800_000_000.5,
)

EXAMPLES: list[Event] = [
    HostRegistered(event_id="g-reg", at=1_800_000_000.0, host_id="host-1", hostname="laptop-1", resources=RES, agent_version="0.1.0"),
    HostHeartbeat(
        event_id="g-hb", at=1_800_000_001.0, host_id="host-1", state="accepting", resources=RES,
        residencies=(Residency(model_id=MODEL, memory_mb=400, state="ready", artifact_sha256=SHA, loaded_age_seconds=120.0,
                               last_used_age_seconds=3.0, active_requests=1, max_concurrency=2, endpoint="http://127.0.0.1:20001"),),
        cached=(CachedArtifact(model_id=MODEL, sha256=SHA, size_bytes=98362432),),
        disk_free_bytes=50 << 30, disk_total_bytes=250 << 30, load=HostLoad(active_tasks=1, queue_depth=0, cpu_percent=12.5),
    ),
    ProtectionTransition(event_id="g-prot", at=1_800_000_002.0, host_id="host-1", from_state="accepting", to_state="throttled",
                         reason="battery_low", sensors={"battery_percent": 18.0, "cpu_temp_c": None}),
    QualificationRecorded(event_id="g-qual", at=1_800_000_002.5, host_id="host-1", runtime="llama.cpp", model_id=MODEL,
                          artifact_sha256=SHA, result="failed", failed_step="inference", reason="engine_exited",
                          steps=(QualificationStep(name="inventory", ok=True, seconds=0.01),
                                 QualificationStep(name="inference", ok=False, seconds=0.2, reason="engine_exited"))),
    ActionAck(event_id="g-ack", at=1_800_000_003.0, host_id="host-1", action_id="a1", status="succeeded", message="ready",
              duration_seconds=1.5, kind="warm", model_id=MODEL, generation="e:00000000000000000001:d", controller_term=1),
    RequestCompleted(event_id="g-rc", at=1_800_000_004.0, features=FEATURES),
    RequestFailed(event_id="g-rf", at=1_800_000_005.0, features=msgspec.structs.replace(FEATURES, outcome="error", status_code=502)),
    RequestBatch(event_id="g-rb", at=1_800_000_006.0, source="gateway-1", records=(FEATURES, FEATURES)),
    ProfileSet(event_id="g-ps", at=1_800_000_007.0, profile=ModelProfile(model_id=MODEL, memory_mb=400, artifact_sha256=SHA,
                                                                          min_replicas=1, workload_scores={"general": 1.0})),
    ProfileRemoved(event_id="g-pr", at=1_800_000_008.0, model_id=MODEL),
    ModeSet(event_id="g-mode", at=1_800_000_009.0, mode="automatic"),
    HostOverride(event_id="g-ovr", at=1_800_000_010.0, host_id="host-1", state="draining", reason="taking laptop home", expires_at=1_800_003_610.0),
    TickRequested(event_id="g-tick", at=1_800_000_011.0, reason="operator"),
    ForecastWindowSet(event_id="g-window", at=1_800_000_011.2, bucket_seconds=4.0),
    CredentialRevoked(event_id="g-revoke", at=1_800_000_011.5, host_id="host-1",
                      keys=("UCRB3TUTBKH5SNSLY7BSMYVMUCHJ6DPAJQKCGG2RWHXDKQLIZQJGIMYM",), reason="laptop lost"),
    RouteAdmitted(event_id="g-route-admitted", at=1_800_000_011.6, host_id="host-1", model_id=MODEL, kind="llama.cpp",
                  url_fingerprint="d30a576c0318716717366ab932e3d7dfbc4009a5bc10176403b60892912f070e",
                  reason="the lab's llama-server"),
    RouteWithdrawn(event_id="g-route-withdrawn", at=1_800_000_011.7, host_id="host-1", model_id=MODEL,
                   reason="served by a managed replica now"),
    PlanCreated(event_id="g-plan", at=1_800_000_012.0, planner_version="1", generation="e:00000000000000000001:d", epoch="e",
                sequence=1, inputs_digest="d", based_on={"GRID_HOSTS": 10}, now=1_800_000_012.0, controller_id="c1",
                controller_term=1, plan=msgspec.Raw(b'{"placements":[]}')),
    CommandIssued(event_id="g-cmd", at=1_800_000_013.0, action_id="a1", kind="warm", host_id="host-1", model_id=MODEL,
                  memory_mb=400, generation="e:00000000000000000001:d", controller_term=1, controller_id="c1",
                  lease_expires_at=1_800_000_028.0, lease_ttl_seconds=15.0, dependencies=("a0",), reason="missing_replica",
                  created_at=1_800_000_013.0, artifact_sha256=SHA),
    CommandWithdrawn(event_id="g-wd", at=1_800_000_014.0, action_id="a1", host_id="host-1", reason="left_automatic"),
    EvaluationRecorded(event_id="g-eval", at=1_800_000_015.0, model_id=MODEL, workload="coding", score=0.75, samples=8,
                       passed=6, total=8, latency_ms=812.5, artifact_sha256=SHA),
]

GOLDEN_DIR = Path(__file__).parent / "events"


def tag_of(event: Event) -> str:
    return event.__struct_config__.tag  # type: ignore[attr-defined, return-value]


def write_missing() -> list[Path]:
    GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    written = []
    for event in EXAMPLES:
        path = GOLDEN_DIR / f"{tag_of(event)}.json"
        if not path.exists():
            path.write_bytes(msgspec.json.format(codec.encode(event), indent=2) + b"\n")
            written.append(path)
    return written


if __name__ == "__main__":
    for p in write_missing():
        print("wrote", p)
