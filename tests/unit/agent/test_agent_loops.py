"""The agent's loops that own their state (grid.agent.protection_loop, grid.agent.external_loop):
a protection transition is persisted before it is reported and the heartbeat is poked after; a
failing sensor at start leaves the restored state; an external probe round never raises, and a
failed forward to an external engine runs one at once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from grid.agent.external import ExternalEngines
from grid.agent.external_loop import ExternalProbes
from grid.agent.options import AgentOptions
from grid.agent.overrides import OverrideWatcher
from grid.agent.protection import ProtectionPolicy, SensorSample
from grid.agent.protection_loop import ProtectionLoop
from grid.agent.sensors import FixedSensors, SensorSource
from grid.agent.state import AgentState
from grid.clock import SimulatedClock
from grid.events import codec
from grid.events.base import Event
from grid.events.host import ProtectionTransition
from grid.events.log import AppendResult, InMemoryLog
from grid.events.subjects import HOSTS_STREAM
from grid.tasks import cancel_and_wait


class RecordingLog(InMemoryLog):
    def __init__(self, calls: list[str]) -> None:
        super().__init__()
        self.calls = calls

    async def append(self, event: Event, *, expected_last_subject_seq: int | None = None) -> AppendResult:
        self.calls.append(f"append:{type(event).__name__}")
        return await super().append(event, expected_last_subject_seq=expected_last_subject_seq)


class BrokenSensors:
    def read(self) -> SensorSample:
        raise OSError("no sensors here")


def protection_loop(tmp_path: Path, log: InMemoryLog, sensors: SensorSource, calls: list[str]) -> ProtectionLoop:
    options = AgentOptions(policy=ProtectionPolicy(debounce_samples=1), sample_interval=0.01)

    def on_transition() -> None:
        calls.append(f"persist:{loop.status.state}")

    loop = ProtectionLoop(log, SimulatedClock(), OverrideWatcher(tmp_path / "override.json", calls.append),
                          calls.append, host_id=lambda: "h1", sensors=lambda: sensors,
                          options=lambda: options, on_transition=on_transition, poke=lambda: calls.append("poke"))
    return loop


async def transitions(log: InMemoryLog) -> list[ProtectionTransition]:
    return [e async for m in log.replay(HOSTS_STREAM) if isinstance(e := codec.decode(m.data), ProtectionTransition)]


async def test_a_transition_is_persisted_then_reported_then_poked(tmp_path: Path) -> None:
    calls: list[str] = []
    log = RecordingLog(calls)
    loop = protection_loop(tmp_path, log, FixedSensors(SensorSample(memory_percent=99.0)), calls)
    await loop.first_sample()
    assert loop.status.state == "unhealthy" and loop.last_sample.memory_percent == 99.0
    assert calls == ["persist:unhealthy", "append:ProtectionTransition", "poke"]
    [t] = await transitions(log)
    assert (t.host_id, t.from_state, t.to_state) == ("h1", "accepting", "unhealthy")

    saved = AgentState()
    loop.record(saved)
    again = protection_loop(tmp_path, InMemoryLog(), FixedSensors(), [])
    again.restore(saved)
    assert (again.status.state, again.status.sensor_state) == ("unhealthy", "unhealthy")


async def test_a_failing_sensor_at_start_keeps_the_restored_state_and_the_loop_runs_on(tmp_path: Path) -> None:
    calls: list[str] = []
    log = RecordingLog(calls)
    loop = protection_loop(tmp_path, log, BrokenSensors(), calls)
    saved = AgentState(protection_state="paused", protection_sensor_state="paused")
    loop.restore(saved)
    await loop.first_sample()
    assert loop.status.state == "paused" and loop.status.reason == "restored"
    loop.start()
    assert loop.task is not None and loop.task.get_name() == "agent-protection"
    await asyncio.sleep(0.05)
    assert not loop.task.done()
    await cancel_and_wait([loop.task])
    assert calls == [] and await transitions(log) == []


async def test_an_external_probe_round_never_raises_and_a_wake_runs_one_at_once(tmp_path: Path) -> None:
    rounds: list[str] = []

    class Engines(ExternalEngines):
        async def probe_all(self, http: httpx.AsyncClient, now: float) -> bool:
            rounds.append("round")
            if len(rounds) == 1:
                raise ValueError("a damaged registry")
            return True

    pokes: list[str] = []
    probes = ExternalProbes(Engines(tmp_path), SimulatedClock(), lambda: pokes.append("poke"))
    assert await probes.probe(None) is False and rounds == []
    async with httpx.AsyncClient() as http:
        assert await probes.probe(http) is False and rounds == ["round"]
        probes.start(http)
        assert probes.task is not None and probes.task.get_name() == "agent-external"
        probes.wake.set()
        for _ in range(100):
            if pokes:
                break
            await asyncio.sleep(0.01)
        await cancel_and_wait([probes.task])
    assert rounds == ["round", "round"] and pokes == ["poke"]
