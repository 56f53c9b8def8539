"""Helpers shared by the host-agent integration and e2e tests (commands, log reading, waits)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from grid.agent.artifacts import BUNDLED_MODEL_ID, BUNDLED_SHA256, ArtifactCache
from grid.agent.sensors import FixedSensors
from grid.agent.service import AgentOptions, HostAgent
from grid.config import GridConfig
from grid.events import codec
from grid.events.acks import TERMINAL_ACK_STATUSES, ActionAck
from grid.events.commands import CommandIssued
from grid.events.host import HostHeartbeat, ProtectionTransition
from grid.events.plan import make_generation
from grid.events.subjects import HOSTS_STREAM
from grid.transport.jetstream import JetStreamLog

HOST = "host-test-1"


def make_command(
    action_id: str | None = None,
    kind: str = "drain",
    *,
    host_id: str = HOST,
    model_id: str = "m1",
    term: int = 1,
    controller_id: str = "ctl-a",
    sequence: int = 1,
    epoch: str = "epoch-a",
    ttl: float = 30.0,
    **extra: Any,
) -> CommandIssued:
    return CommandIssued(
        event_id=uuid.uuid4().hex,
        at=time.time(),
        action_id=action_id or uuid.uuid4().hex,
        kind=kind,  # type: ignore[arg-type]
        host_id=host_id,
        model_id=model_id,
        memory_mb=extra.pop("memory_mb", 256),
        generation=make_generation(epoch, sequence, "digest"),
        controller_term=term,
        controller_id=controller_id,
        lease_expires_at=time.time() + ttl,
        lease_ttl_seconds=ttl,
        **extra,
    )


async def host_events(log: JetStreamLog) -> list[Any]:
    out = []
    async for msg in log.replay(HOSTS_STREAM):
        out.append(codec.decode(msg.data))
    return out


async def wait_for(predicate: Callable[[], Awaitable[Any]], timeout: float = 20.0, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(interval)


async def terminal_acks(log: JetStreamLog, action_id: str | None = None) -> list[ActionAck]:
    return [
        e for e in await host_events(log)
        if isinstance(e, ActionAck) and e.status in TERMINAL_ACK_STATUSES
        and (action_id is None or e.action_id == action_id)
    ]


async def wait_ack(log: JetStreamLog, action_id: str, timeout: float = 20.0) -> ActionAck:
    async def found() -> ActionAck | None:
        acks = await terminal_acks(log, action_id)
        return acks[0] if acks else None

    return await wait_for(found, timeout)


async def heartbeats(log: JetStreamLog) -> list[HostHeartbeat]:
    return [e for e in await host_events(log) if isinstance(e, HostHeartbeat)]


async def transitions(log: JetStreamLog) -> list[ProtectionTransition]:
    return [e for e in await host_events(log) if isinstance(e, ProtectionTransition)]


def seed_cache(config: GridConfig, gguf: Path, model_ids: tuple[str, ...] = (BUNDLED_MODEL_ID,)) -> None:
    cache = ArtifactCache(config.artifacts_dir)
    cache.ensure()
    target = cache.blob_path(BUNDLED_SHA256)
    if not target.exists():
        try:
            os.link(gguf, target)
        except OSError:
            shutil.copyfile(gguf, target)
    for model_id in model_ids:
        cache.register(model_id, BUNDLED_SHA256, target.stat().st_size)


@contextlib.asynccontextmanager
async def agent_factory(log: JetStreamLog, config: GridConfig, **defaults: Any) -> AsyncIterator[Callable[..., Awaitable[HostAgent]]]:
    """Start agents on demand with test defaults (overridable per call); stop them all after."""
    agents: list[HostAgent] = []

    async def factory(sensors: FixedSensors | None = None, **overrides: Any) -> HostAgent:
        options = AgentOptions(**{"host_id": HOST, **defaults, **overrides})
        agent = HostAgent(log, config, options, sensor_source=sensors or FixedSensors())
        await agent.start()
        agents.append(agent)
        return agent

    try:
        yield factory
    finally:
        for agent in agents:
            await agent.stop(drain=True)
