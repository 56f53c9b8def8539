"""The agent's protection loop: it samples the sensors, folds in the operator's overrides (the
local file and the log's), steps the pure state machine (grid.agent.protection) and reports each
transition on the log.

It owns the effective status and the sample it came from. The agent keeps the status in its
state file (`restore`, `record`) and reads it for heartbeats, fencing and metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import structlog

from grid.agent.options import AgentOptions
from grid.agent.overrides import LogOverrides, OverrideWatcher, active_override, stricter
from grid.agent.protection import ProtectionStatus, SensorSample
from grid.agent.protection import step as protection_step
from grid.agent.sensors import SensorSource
from grid.agent.state import AgentState
from grid.clock import Clock
from grid.events.base import new_event_id
from grid.events.host import ProtectionTransition
from grid.events.log import EventLog

log = structlog.get_logger("grid.agent")


class ProtectionLoop:
    """`host_id`, `sensors` and `options` are read at every sample: the agent learns them during
    its start, after this loop exists. `on_transition` persists a transition before it is
    reported; `poke` asks for a heartbeat after it."""

    def __init__(
        self,
        event_log: EventLog,
        clock: Clock,
        overrides: OverrideWatcher,
        warn: Callable[[str], None],
        *,
        host_id: Callable[[], str],
        sensors: Callable[[], SensorSource | None],
        options: Callable[[], AgentOptions],
        on_transition: Callable[[], None],
        poke: Callable[[], None],
    ) -> None:
        self.status = ProtectionStatus()
        self.last_sample = SensorSample()
        self.task: asyncio.Task[None] | None = None
        self._log = event_log
        self._clock = clock
        self._overrides = overrides
        self._log_overrides: LogOverrides | None = None
        self._warn = warn
        self._host_id = host_id
        self._sensors = sensors
        self._options = options
        self._on_transition = on_transition
        self._poke = poke

    def restore(self, saved: AgentState) -> None:
        """Resume from the state file; the state counts as entered now (cooldowns restart)."""
        self.status = ProtectionStatus(
            state=saved.protection_state,
            reason=saved.protection_reason or "restored",
            sensor_state=saved.protection_sensor_state,
            sensor_reason=saved.protection_sensor_reason or "restored",
            entered_at=self._clock.monotonic(),
        )

    def record(self, state: AgentState) -> None:
        state.protection_state = self.status.state
        state.protection_reason = self.status.reason
        state.protection_sensor_state = self.status.sensor_state
        state.protection_sensor_reason = self.status.sensor_reason

    async def first_sample(self) -> None:
        """Sample once before the first heartbeat, so it reports a measured state; a failing
        sensor leaves the restored one."""
        try:
            await self.tick()
        except Exception as exc:
            log.warning("agent.protection_failed", error=str(exc))

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name="agent-protection")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._options().sample_interval)
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("agent.protection_failed", error=str(exc))

    async def tick(self) -> None:
        sensors = self._sensors()
        assert sensors is not None
        sample = await asyncio.to_thread(sensors.read)
        self.last_sample = sample
        override = active_override(self._overrides.current(), self._clock.now())
        if self._log_overrides is None:
            self._log_overrides = LogOverrides(self._log, self._host_id(), self._warn)
        try:
            await self._log_overrides.refresh()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the override last read stays in force
            log.warning("agent.override_read_failed", error=str(exc))
        override = stricter(override, active_override(self._log_overrides.current, self._clock.now()))
        status, transition = protection_step(
            self._options().policy, self.status, sample, override, self._clock.monotonic()
        )
        self.status = status
        if transition is None:
            return
        self._on_transition()
        log.info("agent.protection", from_state=transition.from_state, to_state=transition.to_state,
                 reason=transition.reason)
        with contextlib.suppress(Exception):
            await self._log.append(
                ProtectionTransition(
                    event_id=new_event_id(),
                    at=self._clock.now(),
                    host_id=self._host_id(),
                    from_state=transition.from_state,  # type: ignore[arg-type]
                    to_state=transition.to_state,  # type: ignore[arg-type]
                    reason=transition.reason[:200],
                    override=transition.override,
                    sensors=sample.as_readings(),
                )
            )
        self._poke()
