"""The pure tick runs on a worker thread over projection states held at its start: the fold goes
on on the event loop meanwhile, and nothing it folds changes that tick's input, its plan or the
positions the recorded plan names."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from grid.controller import service
from grid.controller.service import Controller, ControllerSettings
from grid.controller.tick import PROJECTIONS, compose_tick
from grid.events.base import new_event_id
from grid.events.codec import encode_value
from grid.events.control import ModelProfile, ProfileSet
from grid.events.host import Residency
from grid.events.requests import RequestBatch, RequestFeatures
from grid.events.subjects import HOSTS_STREAM, REQUESTS_STREAM
from grid.projections.runner import ProjectionRunner
from grid.transport.jetstream import JetStreamLog
from tests.heartbeats import heartbeat
from tests.integration.controller.simhost import wait_for

SETTINGS = ControllerSettings(background_ticks=False, lease_ttl_seconds=5.0, lease_renew_seconds=1.0,
                              restart_grace_seconds=0.0)
MODELS = ("model-a.gguf", "model-b.gguf")


def requests(n: int, host: str) -> RequestBatch:
    records = tuple(
        RequestFeatures(endpoint="chat", requested_model=MODELS[i % 2], served_model=MODELS[i % 2], host_id=host,
                        output_units=40 + i, service_seconds=0.4, finished_at=time.time())
        for i in range(n))
    return RequestBatch(event_id=new_event_id(), at=time.time(), source="gw", records=records)


async def folded_everything(ctl: Controller, log: JetStreamLog) -> bool:
    for stream in ctl.runner.streams:
        if ctl.runner.positions.get(stream, 0) < await log.last_sequence(stream):
            return False
    return True


async def test_a_fold_during_a_tick_does_not_change_that_ticks_input(
        js_log: JetStreamLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for m in MODELS:
        await js_log.append(ProfileSet(event_id=new_event_id(), at=0, profile=ModelProfile(
            model_id=m, memory_mb=1000, min_replicas=1, max_replicas=3)))
    for i in range(3):
        await js_log.append(heartbeat(f"h{i}", Residency(model_id=MODELS[i % 2], memory_mb=1000, state="ready")))
        await js_log.append(requests(20, f"h{i}"))
    ctl = Controller(js_log, tmp_path / "home", settings=SETTINGS, controller_id="ctl-held")
    # The pure tick waits on its worker thread until the test has folded more of the log.
    entered, release = threading.Event(), threading.Event()
    real = service.run_tick

    def gated(*args, **kwargs):  # type: ignore[no-untyped-def]
        entered.set()
        assert release.wait(30), "the test never released the tick"
        return real(*args, **kwargs)

    monkeypatch.setattr(service, "run_tick", gated)
    await ctl.start()
    try:
        await wait_for(lambda: ctl.lease is not None and ctl.lease.held)
        for _ in range(100):
            if await folded_everything(ctl, js_log):
                break
            await asyncio.sleep(0.05)
        # What the tick will hold (nothing else writes to the log now).
        at_start = ctl.runner.snapshot_bytes()
        positions = dict(sorted(ctl.runner.positions.items()))
        ticking = asyncio.create_task(ctl.tick("test"))
        assert await asyncio.to_thread(entered.wait, 10)
        # Meanwhile, on the loop: a new host, a changed one, more demand (folded in place).
        await js_log.append(heartbeat("h9"))
        await js_log.append(heartbeat("h0"))
        last = (await js_log.append(requests(30, "h1"))).seq
        await wait_for(lambda: ctl.runner.positions.get(REQUESTS_STREAM, 0) >= last, timeout=10)
        assert ctl.runner.positions[HOSTS_STREAM] > positions[HOSTS_STREAM]
        assert not ticking.done()
        release.set()
        report = await ticking
    finally:
        release.set()
        await ctl.stop()
    assert report.error is None and report.plan_recorded
    assert report.cpu_ms > 0
    held = ProjectionRunner(PROJECTIONS)
    held.restore_bytes(at_start)
    expected = compose_tick(held.states, report.at, SETTINGS.policy)
    assert ctl.last_input is not None and ctl.last_plan is not None
    assert encode_value(ctl.last_input) == encode_value(expected.planner_input)
    assert encode_value(ctl.last_plan) == encode_value(expected.plan)
    # The recorded plan names the positions its input was held at, not where the fold got to.
    recorded = ctl.runner["plans"].latest
    assert recorded is not None and recorded.based_on == positions
    assert recorded.inputs_digest == expected.plan.inputs_digest
    # And the fold during the tick did change what a tick at that instant would read.
    moved_on = compose_tick(ctl.runner.states, report.at, SETTINGS.policy)
    assert encode_value(moved_on.planner_input) != encode_value(expected.planner_input)


async def test_a_wave_of_commands_goes_out_many_hosts_at_a_time_each_hosts_in_order(
        js_log: JetStreamLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first wave (100 hosts x 3 loads) is appended up to PUBLISH_CONCURRENCY hosts at a time,
    and each host's commands reach its subject in the reconciler's order."""
    from grid.controller.governor import Limits
    from grid.events.commands import CommandIssued
    from grid.events.control import ModeSet
    from tests.integration.controller.simhost import commands_in_log

    hosts = [f"h{i:03d}" for i in range(100)]
    models = ("m-a.gguf", "m-b.gguf", "m-c.gguf")
    for h in hosts:
        await js_log.append(heartbeat(h))
    for m in models:
        await js_log.append(ProfileSet(event_id=new_event_id(), at=0, profile=ModelProfile(
            model_id=m, memory_mb=1000, min_replicas=len(hosts), max_replicas=len(hosts))))
    await js_log.append(ModeSet(event_id=new_event_id(), at=0, mode="automatic"))
    settings = ControllerSettings(
        background_ticks=False, lease_ttl_seconds=30.0, lease_renew_seconds=5.0, restart_grace_seconds=0.0,
        limits=Limits(max_global_mutations=1000, max_host_mutations=3, artifact_fanout=1000))
    ctl = Controller(js_log, tmp_path / "home", settings=settings, controller_id="ctl-wave")
    in_flight = peak = 0
    append = js_log.append

    async def counting(event, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal in_flight, peak
        if not isinstance(event, CommandIssued):
            return await append(event, **kwargs)
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            return await append(event, **kwargs)
        finally:
            in_flight -= 1

    await ctl.start()
    try:
        await wait_for(lambda: ctl.lease is not None and ctl.lease.held)
        monkeypatch.setattr(js_log, "append", counting)
        report = await ctl.tick("test")
        monkeypatch.undo()
    finally:
        await ctl.stop()
    assert report.error is None and report.published == len(hosts) * len(models)
    assert 8 < peak <= service.PUBLISH_CONCURRENCY
    assert ctl.last_result is not None
    decided: dict[str, list[str]] = {}
    for a in ctl.last_result.actions:
        decided.setdefault(a.host_id, []).append(a.action_id)
    logged: dict[str, list[str]] = {}
    for c in await commands_in_log(js_log):
        logged.setdefault(c.host_id, []).append(c.action_id)
    assert logged == decided and all(len(v) == len(models) for v in logged.values())
