"""The determinism guard on a real session: the real controller and real host agents on real NATS.

Two host agents run real llama-server children (the bundled SmolLM2 GGUF); the real Controller
follows the log, forecasts, plans and commands them in automatic mode while a gateway-like
writer appends request batches and an operator changes profiles mid-traffic. One host's
protection flips between accepting and throttled every sample (its CPU reading alternates and
its protection policy has no debounce), so the controller plans with that host flap-quarantined
for most of the session. Afterwards every plan the controller recorded is replayed from
JetStream, from an export file and from the DuckDB store, and must reproduce byte for byte from
inputs with the recorded digest (the quarantines included).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest

from grid.agent.artifacts import BUNDLED_MODEL_ID, BUNDLED_SHA256
from grid.agent.engines.runtime import Runtime
from grid.agent.protection import ProtectionPolicy, SensorSample
from grid.agent.sensors import FixedSensors
from grid.agent.service import AgentOptions, HostAgent
from grid.analytics.sink import AnalyticsSink, open_store
from grid.cli.events import _ndjson_line
from grid.config import GridConfig
from grid.controller.service import Controller, ControllerSettings
from grid.events import codec
from grid.events.base import new_event_id
from grid.events.control import ModelProfile, ModeSet, ProfileSet
from grid.events.host import HostHeartbeat
from grid.events.plan import PlanCreated
from grid.events.requests import RequestBatch, RequestFeatures
from grid.events.subjects import ALL_STREAMS, HOSTS_STREAM, PLANS_STREAM
from grid.transport.jetstream import JetStreamLog
from replay import DuckDBSource, FileSource, LogSource, replay_window
from tests.integration.agent.agentkit import seed_cache
from tests.ports import engine_ports

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SECOND_MODEL = "smol-second.Q4_1.gguf"
FLAPPING_HOST = "host-1"
# Every sample that asks for another state gets it at once.
NO_DEBOUNCE = ProtectionPolicy(debounce_samples=1, recovery_samples=1, recovery_cooldown_seconds=0.0)
SETTINGS = ControllerSettings(tick_interval_seconds=0.3, coalesce_seconds=0.05, lease_ttl_seconds=3.0,
                              lease_renew_seconds=0.5, restart_grace_seconds=0.0, plan_refresh_seconds=1.0)


def profile(model: str, replicas: int) -> ModelProfile:
    return ModelProfile(
        model_id=model, memory_mb=300, artifact_sha256=BUNDLED_SHA256, min_replicas=replicas, max_replicas=2,
        min_residency_seconds=0.0, scale_down_cooldown_seconds=0.0, load_seconds=2.0, warm_seconds=3.0,
    )


async def ready_count(log: JetStreamLog, model: str) -> int:
    latest: dict[str, HostHeartbeat] = {}
    async for msg in log.replay(HOSTS_STREAM):
        ev = codec.decode(msg.data)
        if isinstance(ev, HostHeartbeat):
            latest[ev.host_id] = ev
    return sum(1 for hb in latest.values() for r in hb.residencies if r.model_id == model and r.state == "ready")


async def wait_ready(log: JetStreamLog, model: str, n: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await ready_count(log, model) >= n:
            return
        await asyncio.sleep(0.3)
    raise AssertionError(f"{model} never had {n} ready replica(s)")


async def gateway(log: JetStreamLog, stop: asyncio.Event) -> None:
    """Request telemetry as the gateway writes it: one batch every 0.2 s, both model names."""
    i = 0
    while not stop.is_set():
        i += 1
        records = tuple(
            RequestFeatures(endpoint="chat", requested_model=m, served_model=m, host_id=None, workload="coding",
                            input_units=40 + i % 7, output_units=12, service_seconds=0.05 * (1 + i % 5),
                            queue_seconds=0.001, finished_at=time.time())
            for m in (BUNDLED_MODEL_ID, SECOND_MODEL)
        )
        await log.append(RequestBatch(event_id=new_event_id(), at=time.time(), source="gw-1", records=records))
        await asyncio.sleep(0.2)


async def flap(sensors: FixedSensors, stop: asyncio.Event, every: float) -> None:
    """Alternate the CPU reading between busy and idle until stopped."""
    busy = False
    while not stop.is_set():
        busy = not busy
        sensors.set(SensorSample(cpu_percent=99.0 if busy else 10.0))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), every)


async def wait_quarantined(controller: Controller, host_id: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pin = controller.last_input
        if pin is not None and any(q.kind == "host" and q.subject == host_id for q in pin.flap_quarantines):
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{host_id} was never flap-quarantined")


async def test_controller_session_replays_byte_for_byte(js_log: JetStreamLog, tmp_path: Path,
                                                         engine_runtime: Runtime, bundled_gguf: Path) -> None:
    agents: list[HostAgent] = []
    flapping = FixedSensors()
    for i in range(2):
        config = GridConfig(home=tmp_path / f"agent-{i}", nats_url=None)
        config.ensure_home()
        seed_cache(config, bundled_gguf, (BUNDLED_MODEL_ID, SECOND_MODEL))
        agent = HostAgent(js_log, config, AgentOptions(
            host_id=f"host-{i}", capacity_mb=4000, failure_domain=f"rack-{i}", heartbeat_interval=0.5,
            sample_interval=0.5, port_range=engine_ports(),
            **({"policy": NO_DEBOUNCE} if f"host-{i}" == FLAPPING_HOST else {}),
        ), sensor_source=flapping if f"host-{i}" == FLAPPING_HOST else FixedSensors())
        await agent.start()
        agents.append(agent)
    controller = Controller(js_log, tmp_path / "controller-home", settings=SETTINGS, controller_id="ctl-replay")
    stop = asyncio.Event()
    traffic = asyncio.create_task(gateway(js_log, stop))
    flapper = asyncio.create_task(flap(flapping, stop, 0.6))
    try:
        await controller.start()
        await js_log.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=profile(BUNDLED_MODEL_ID, 1)))
        await js_log.append(ModeSet(event_id=new_event_id(), at=time.time(), mode="automatic"))
        await wait_ready(js_log, BUNDLED_MODEL_ID, 1)
        # Mid-traffic profile changes: a second model, then a second replica of the first.
        await js_log.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=profile(SECOND_MODEL, 1)))
        await wait_ready(js_log, SECOND_MODEL, 1)
        await js_log.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=profile(BUNDLED_MODEL_ID, 2)))
        await wait_ready(js_log, BUNDLED_MODEL_ID, 2)
        await wait_quarantined(controller, FLAPPING_HOST)
        await asyncio.sleep(2.5)  # a few unchanged plans, refreshed once a second
    finally:
        stop.set()
        await traffic
        await flapper
        await controller.stop()
        for agent in agents:
            await agent.stop(drain=True)

    plans = [codec.decode(m.data) async for m in js_log.replay(PLANS_STREAM)]
    assert len(plans) >= 4 and all(isinstance(p, PlanCreated) for p in plans)
    assert {p.controller_id for p in plans} == {"ctl-replay"}

    result = await replay_window(LogSource(js_log))
    assert_reproduced(result, len(plans))

    export = tmp_path / "session.ndjson"
    with open(export, "wb") as f:
        for stream in ALL_STREAMS:
            async for msg in js_log.replay(stream):
                f.write(_ndjson_line(msg.stream, msg.seq, msg.subject, msg.time, msg.data))
    assert_reproduced(await replay_window(FileSource(export)), len(plans))

    con = open_store(tmp_path / "analytics.duckdb")
    sink = AnalyticsSink(con)
    await sink.sync(js_log)
    sink.close()
    from_store = await replay_window(DuckDBSource(con))
    con.close()
    assert_reproduced(from_store, len(plans))


def assert_reproduced(result, n_plans: int) -> None:  # type: ignore[no-untyped-def]
    """Every plan reproduced byte for byte from an input with the recorded digest.

    A digest mismatch is accepted only when the replay proved it is the recorder's based_on
    running ahead of the input it planned from (the input with the exact recorded digest was
    found a few events earlier, and the plan re-ran byte for byte from it).
    """
    s = result.summary
    for warning in result.warnings:
        print(f"replay warning ({result.source}): {warning}")
    detail = [(p.plan_seq, p.status, p.diagnosis) for p in result.plans if p.status != "identical" or not p.digest_match]
    assert s.plans_compared == n_plans
    assert s.identical == n_plans, detail
    assert s.digest_mismatches == s.based_on_drift, detail
