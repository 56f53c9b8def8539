"""Predictive prefetch end to end: a real controller, a real host agent and the real SmolLM2 GGUF.

Request telemetry (as the gateway appends it, in one-second forecast buckets) first shows chat
models and SmolLM2 busy in the same buckets, then only the chat models, one at a time: SmolLM2's
demand becomes correlation-only. Its profile asks for all of the host's new-work memory, which the machine's
other processes already use part of, so the prediction gets no serving slot; the host's disk is
large. The controller's plan then carries a cache-only advisory (visible in `gridctl status`),
and in automatic mode the agent receives a PREDICTIVE_PREFETCH load: it copies and verifies the
exact artifact, never starts an engine, and reports the download as predictive. When the
prediction goes away and the entry is older than the (shortened) predictive cache TTL, the plan
expires it and the agent evicts exactly that SHA: the heartbeat no longer lists it and the disk
is back.

Every process speaks with its own credential on a nats-server in operator mode: the controller,
the host agent (its own command consumer), the gateway that appends the telemetry and the
operator who sets the profiles, the forecast window and the mode. Each event is signed by its
writer and the controller's folds accept it only as that writer's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from grid.agent.artifacts import BUNDLED_MODEL_ID, BUNDLED_SHA256, BUNDLED_SIZE_BYTES, FILE_ROOTS_ENV
from grid.agent.outcomes import MSG_EVICTED
from grid.config import GridConfig
from grid.controller.service import Controller, ControllerSettings
from grid.events import codec
from grid.events.base import new_event_id
from grid.events.commands import PREDICTIVE_PREFETCH, CommandIssued
from grid.events.control import ForecastWindowSet, ModelProfile, ModeSet, ProfileSet
from grid.events.host import CachedArtifact, HostHeartbeat
from grid.events.plan import PlanCreated
from grid.events.requests import RequestBatch, RequestFeatures
from grid.events.subjects import PLANS_STREAM
from grid.fleet import reasons as R
from grid.fleet.planning import Plan, Policy, decode_plan
from grid.fleet.views import raw_allocatable_mb
from grid.identity.authority import Authority
from grid.identity.connect import connect_log
from grid.identity.permissions import Role
from grid.identity.provision import provision_host_consumer
from grid.transport.jetstream import JetStreamLog
from replay import LogSource, replay_window
from tests.integration.agent.agentkit import HOST, agent_factory, heartbeats, wait_ack
from tests.integration.controller.simhost import commands_in_log
from tests.integration.controller.simhost import wait_for as _wait_for
from tests.integration.controller.statuskit import serving_controller
from tests.integration.controller.test_cli_admin import gridctl
from tests.integration.replay.test_controller_session import assert_reproduced
from tests.ports import engine_ports
from tests.security.conftest import CredsFactory, SecuredNats, authority, controller_log, creds, secured_server

# The operator-mode server and credentials of the security tests (fixtures used by name).
__all__ = ["authority", "controller_log", "creds", "secured_server"]

pytestmark = pytest.mark.slow

# The models the traffic names with SmolLM2 first, then in turn without it: the correlation's
# sources. A group edge holds while >= 70 % of its source's busy buckets also saw SmolLM2, so
# one source keeps the prediction alive for about 0.43 x SHARED_BUCKETS source-only buckets; each
# takes RELAY_BUCKETS at a time and the next one starts with its edge intact, so the prediction
# lasts about len(SOURCES) x that: long enough for `gridctl status` (a process start each) and
# the operator's mode change on a loaded two-core machine, without a longer first phase.
SOURCES = tuple(f"chat-model-{i}" for i in range(6))
PREDICTED = BUNDLED_MODEL_ID
TTL_SECONDS = 15.0
SETTINGS = ControllerSettings(
    tick_interval_seconds=0.3, coalesce_seconds=0.05, lease_ttl_seconds=3.0, lease_renew_seconds=0.5,
    restart_grace_seconds=0.0,
    policy=Policy(predictive_cache_ttl_seconds=TTL_SECONDS, predictive_disk_reserve_bytes=1 << 30),
)
# Complete one-second buckets in which every model is busy before SmolLM2 goes quiet.
SHARED_BUCKETS = 20
RELAY_BUCKETS = 4
CAPACITY_MB = 2000


class Gateway:
    """Request telemetry as the gateway writes it (a batch every 0.25 s): every model (`shared`),
    then one source at a time (`relay`), then none; counts the one-second buckets all saw."""

    def __init__(self, log: JetStreamLog) -> None:
        self.log = log
        self.phase = "shared"
        self.shared_buckets: set[int] = set()
        self.stop = asyncio.Event()

    def models(self, now: float) -> tuple[str, ...]:
        if self.phase == "shared":
            return (*SOURCES, PREDICTED)
        if self.phase == "relay":
            return (SOURCES[int(now) // RELAY_BUCKETS % len(SOURCES)],)
        return ()

    async def run(self) -> None:
        while not self.stop.is_set():
            now = time.time()
            phase, models = self.phase, self.models(now)
            if models:
                records = tuple(
                    RequestFeatures(endpoint="chat", requested_model=m, served_model=m, workload="chat",
                                    input_units=40, output_units=12, service_seconds=0.5, finished_at=now)
                    for m in models for _ in range(3)
                )
                await self.log.append(RequestBatch(event_id=new_event_id(), at=now, source="gw-1", records=records))
                # The server (on this machine's clock) stamped it between `now` and the reply.
                if phase == "shared" and int(now) == int(time.time()):
                    self.shared_buckets.add(int(now))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stop.wait(), 0.25)


async def wait_for(predicate, what: str, timeout: float, interval: float = 0.2):  # type: ignore[no-untyped-def]
    """simhost.wait_for, whose failure says what did not happen."""
    try:
        return await _wait_for(predicate, timeout=timeout, interval=interval)
    except AssertionError:
        raise AssertionError(f"{what}: not within {timeout:g} s") from None


def forecast_of(ctl: Controller, model_id: str) -> str:
    """The controller's latest forecast row for `model_id` and its correlations (for a failure)."""
    fc = ctl.last_forecast
    if fc is None:
        return "none yet"
    row = next((r for r in fc.models if r.model_id == model_id), None)
    return f"now={fc.now} row={row} correlations={fc.correlations}"


def cached(hb: HostHeartbeat, model_id: str) -> CachedArtifact | None:
    return next((c for c in hb.cached if c.model_id == model_id), None)


async def latest_heartbeat(log: JetStreamLog) -> HostHeartbeat:
    return (await heartbeats(log))[-1]


async def recorded_plans(log: JetStreamLog) -> dict[str, Plan]:
    """Every plan the controller recorded, by generation, oldest first."""
    out = {}
    async for msg in log.replay(PLANS_STREAM):
        event = codec.decode(msg.data)
        assert isinstance(event, PlanCreated)
        out[event.generation] = decode_plan(bytes(event.plan))
    return out


async def status_json(home: Path) -> dict[str, Any]:
    rc, out, err = await gridctl(home, "status", "--json")
    assert rc == 0, err
    return json.loads(out)


@contextlib.asynccontextmanager
async def connected(server: SecuredNats, credentials: Path, name: str) -> AsyncIterator[JetStreamLog]:
    """A log connection as the identity of `credentials` (not the controller: no stream management)."""
    log = await connect_log(server.url, credentials=credentials, name=name, ensure_streams=False)
    try:
        yield log
    finally:
        await log.close()


async def test_a_prediction_without_a_slot_is_prefetched_then_expired_and_evicted(
        controller_log: JetStreamLog, secured_server: SecuredNats, creds: CredsFactory, authority: Authority,
        tmp_path: Path, bundled_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The operator's share the profile names as the exact source (a copy: the cache copies it in).
    share = tmp_path / "share"
    share.mkdir()
    artifact = share / "smollm2.gguf"
    shutil.copyfile(bundled_gguf, artifact)
    monkeypatch.setenv(FILE_ROOTS_ENV, str(share))
    config = GridConfig(home=tmp_path / "agent-home", nats_url=None)
    config.ensure_home()
    home = tmp_path / "controller-home"

    host_creds = creds(Role.HOST, host_id=HOST)
    await provision_host_consumer(controller_log, authority.host_principal(HOST))
    async with (connected(secured_server, host_creds, "grid-agent") as agent_log,
                connected(secured_server, creds(Role.GATEWAY), "grid-gateway") as gateway_log,
                connected(secured_server, creds(Role.OPERATOR), "gridctl") as operator_log,
                agent_factory(agent_log, config, credentials=host_creds, heartbeat_interval=0.3,
                              sample_interval=0.1, port_range=engine_ports()) as start_agent):
        agent = await start_agent(capacity_mb=CAPACITY_MB)
        first = await wait_for(lambda: agent.last_heartbeat, "the agent's first heartbeat", timeout=20)
        # All the new-work memory the host offers: it passes the static check, but the machine's
        # other processes (reported as unmanaged memory) always hold some of it.
        memory_mb = raw_allocatable_mb(first.resources)
        assert first.unmanaged_memory_mb > 0
        await operator_log.append(ForecastWindowSet(event_id=new_event_id(), at=time.time(), bucket_seconds=1.0))
        for source in SOURCES:  # telemetry only: never placed
            await operator_log.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=ModelProfile(
                model_id=source, memory_mb=300, min_replicas=0, max_replicas=0)))
        await operator_log.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=ModelProfile(
            model_id=PREDICTED, memory_mb=memory_mb, max_replicas=1, artifact_sha256=BUNDLED_SHA256,
            artifact_source=artifact.as_uri(), artifact_size_mb=100, expected_service_seconds=0.5,
            min_residency_seconds=0.0, scale_down_cooldown_seconds=0.0)))

        gateway = Gateway(gateway_log)
        traffic = asyncio.create_task(gateway.run())
        try:
            async with serving_controller(controller_log, home, "ctl-prefetch", SETTINGS) as ctl:
                await wait_for(lambda: len(gateway.shared_buckets) >= SHARED_BUCKETS + 1, "the shared buckets", timeout=60)
                gateway.phase = "relay"

                # 1. Correlation-only demand without a slot: the plan (recommend mode: nothing is
                # issued yet) carries the advisory, and `gridctl status` shows it.
                def advising() -> bool:
                    plan = ctl.last_plan
                    return plan is not None and any(a.model_id == PREDICTED for a in plan.prefetch)

                try:
                    await wait_for(advising, "an advisory in the controller's plan", timeout=30, interval=0.1)
                except AssertionError as exc:
                    raise AssertionError(f"{exc}; forecast: {forecast_of(ctl, PREDICTED)}") from None
                async def advised() -> dict[str, Any] | None:
                    doc = await status_json(home)
                    plan = doc["plan"] or {}
                    return doc if any(a["model_id"] == PREDICTED for a in plan.get("prefetch", [])) else None

                doc = await wait_for(advised, "the advisory in gridctl status", timeout=20)
                [advisory] = doc["plan"]["prefetch"]
                assert (advisory["host_id"], advisory["artifact_sha256"], advisory["size_bytes"]) == (
                    HOST, BUNDLED_SHA256, 100 << 20)
                assert advisory["reason"] == R.PREDICTIVE_PREFETCH
                target = next(t for t in doc["forecasts"]["targets"] if t["model_id"] == PREDICTED)
                assert target["evidence"] == "inferred" and "correlation" in target["reason"], target
                assert not [p for p in doc["plan"]["placements"] if p["model_id"] == PREDICTED]
                assert await commands_in_log(controller_log) == []

                await operator_log.append(ModeSet(event_id=new_event_id(), at=time.time(), mode="automatic"))

                async def prefetch_load() -> CommandIssued | None:
                    return next((c for c in await commands_in_log(controller_log)
                                 if c.kind == "load" and c.model_id == PREDICTED), None)

                try:
                    load = await wait_for(prefetch_load, "the prefetch load", timeout=30)
                except AssertionError as exc:
                    raise AssertionError(f"{exc}; forecast: {forecast_of(ctl, PREDICTED)}; "
                                         f"plan: {ctl.last_plan}") from None
                assert (load.host_id, load.reason, load.artifact_sha256) == (HOST, PREDICTIVE_PREFETCH, BUNDLED_SHA256)
                ack = await wait_ack(controller_log, load.action_id, timeout=120)
                assert (ack.status, ack.artifact_fetched) == ("succeeded", True), ack
                rec = agent.state.residencies[PREDICTED]
                assert rec.state == "cached" and rec.process is None  # downloaded, never warmed

                async def reported_predictive() -> HostHeartbeat | None:
                    hb = await latest_heartbeat(controller_log)
                    entry = cached(hb, PREDICTED)
                    return hb if hb.at > ack.at and entry is not None and entry.predictive else None

                hb = await wait_for(reported_predictive, "a heartbeat with the predictive download", timeout=30)
                assert cached(hb, PREDICTED).sha256 == BUNDLED_SHA256  # type: ignore[union-attr]
                assert all(r.state == "cached" for r in hb.residencies if r.model_id == PREDICTED)

                # 2. The prediction goes away: after the TTL the plan expires the download and the
                # agent evicts exactly that SHA.
                gateway.phase = "stopped"

                async def evict_command() -> CommandIssued | None:
                    return next((c for c in await commands_in_log(controller_log) if c.kind == "evict"), None)

                evict = await wait_for(evict_command, "the evict", timeout=TTL_SECONDS + 40, interval=0.3)
                assert (evict.host_id, evict.model_id, evict.artifact_sha256) == (HOST, PREDICTED, BUNDLED_SHA256)
                evicted = await wait_ack(controller_log, evict.action_id, timeout=30)
                assert evicted.status == "succeeded", evicted
                assert evicted.message == f"{MSG_EVICTED}: {BUNDLED_SIZE_BYTES} bytes reclaimed"

                async def reported_gone() -> HostHeartbeat | None:
                    hb = await latest_heartbeat(controller_log)
                    return hb if hb.at > evicted.at and cached(hb, PREDICTED) is None else None

                await wait_for(reported_gone, "a heartbeat without the download", timeout=30)
                # The last report that listed the download against the next one (0.3 s apart:
                # other writers share this disk, so most of the file back, not the exact count).
                reports = await heartbeats(controller_log)
                last = max(i for i, hb in enumerate(reports) if cached(hb, PREDICTED) is not None)
                before, after = reports[last], reports[last + 1]
                assert all(r.model_id != PREDICTED for r in after.residencies)
                assert before.disk_free_bytes is not None and after.disk_free_bytes is not None
                assert after.disk_free_bytes - before.disk_free_bytes > BUNDLED_SIZE_BYTES // 2

                # Each command names a recorded plan that carries its decision: the advisory, and
                # the expiry of the download once its prediction had gone and it was past the TTL.
                plans = await recorded_plans(controller_log)
                advised_by = plans[load.generation]
                assert [(a.host_id, a.model_id, a.artifact_sha256) for a in advised_by.prefetch] == [
                    (HOST, PREDICTED, BUNDLED_SHA256)]
                assert not [p for p in advised_by.placements if p.model_id == PREDICTED]
                expiries = plans[evict.generation].evictions
                assert len(expiries) == 1, f"the evict names plan {evict.generation}, which carries {expiries}"
                expiry = expiries[0]
                assert (expiry.host_id, expiry.model_id, expiry.artifact_sha256) == (HOST, PREDICTED, BUNDLED_SHA256)
                assert expiry.reason == R.PREDICTIVE_CACHE_EXPIRED and expiry.age_seconds >= TTL_SECONDS
                assert not plans[evict.generation].prefetch
                kinds = sorted({c.kind for c in await commands_in_log(controller_log)})
                assert kinds == ["evict", "load"], kinds  # never a warm, never a drain
                # Every event above was accepted as its signer's: nothing was folded unproven.
                assert (await status_json(home))["rejected_events"]["total"] == 0
        finally:
            gateway.stop.set()
            await traffic
    # Every recorded plan, the advisories and the expiry included, rebuilds byte for byte from
    # the log.
    assert_reproduced(await replay_window(LogSource(controller_log)), len(plans))
