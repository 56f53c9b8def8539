"""The local host-protection loop, as a pure state machine.

Six states, ordered by how much they restrict new work:

    accepting < throttled < draining < paused < unhealthy < quarantined

Sensor readings map to a *target* state through entry thresholds; a metric that already holds
the host at a level is judged against its (looser) recovery threshold instead, so a reading
hovering at the boundary cannot flap. Escalation needs `debounce_samples` consecutive samples
that ask for a stricter state (one spike is ignored); recovery needs `recovery_samples`
consecutive calmer samples *and* `recovery_cooldown_seconds` since the stricter state was
entered. An operator override (drain/pause/quarantine) applies at once and is combined with the
sensor state by taking the stricter of the two: confirmed local safety outranks both the
override and the global plan, so a hot machine cannot be released back to accepting.

Unknown readings are None, never zero. By default they are ignored; `unknown_throttles`
conservatively throttles when a sensor the policy relies on is missing (not GPU memory: a host
without a discrete GPU has none to read).

`step` takes `now` (monotonic seconds) explicitly and never reads a clock.
"""

from __future__ import annotations

import msgspec

STATE_ORDER: tuple[str, ...] = ("accepting", "throttled", "draining", "paused", "unhealthy", "quarantined")
SEVERITY: dict[str, int] = {s: i for i, s in enumerate(STATE_ORDER)}

OVERRIDE_STATES: tuple[str, ...] = ("draining", "paused", "quarantined")

REASON_NOMINAL = "nominal"
REASON_CPU_HIGH = "cpu_high"
REASON_MEMORY_HIGH = "memory_high"
REASON_MEMORY_CRITICAL = "memory_critical"
REASON_GPU_MEMORY_HIGH = "gpu_memory_high"
REASON_TEMPERATURE_HIGH = "temperature_high"
REASON_TEMPERATURE_CRITICAL = "temperature_critical"
REASON_ON_BATTERY = "on_battery"
REASON_BATTERY_LOW = "battery_low"
REASON_USER_ACTIVE = "user_active"
REASON_SENSOR_UNKNOWN = "sensor_unknown"
REASON_OVERRIDE_PREFIX = "override"


class SensorSample(msgspec.Struct, frozen=True, kw_only=True):
    """One reading of every local sensor; None means unknown (never zero)."""

    cpu_percent: float | None = None
    memory_percent: float | None = None
    temperature_c: float | None = None
    battery_percent: float | None = None
    # True charging/plugged in, False on battery, None no battery or unknown.
    power_plugged: bool | None = None
    user_idle_seconds: float | None = None
    # GPU memory pressure: percent of the fullest discrete GPU's memory in use by anything but
    # this agent's own engines (grid.agent.accelerators.others_gpu_memory_percent); None: no such
    # GPU, unreadable, or an own engine's use on it unknown.
    gpu_memory_percent: float | None = None

    def as_readings(self) -> dict[str, float | None]:
        plugged = None if self.power_plugged is None else float(self.power_plugged)
        return {
            "cpu_percent": self.cpu_percent,
            "memory_percent": self.memory_percent,
            "temperature_c": self.temperature_c,
            "battery_percent": self.battery_percent,
            "power_plugged": plugged,
            "user_idle_seconds": self.user_idle_seconds,
            "gpu_memory_percent": self.gpu_memory_percent,
        }


class ProtectionPolicy(msgspec.Struct, frozen=True, kw_only=True):
    # (entry, recovery) pairs: enter at >= entry, leave when < recovery.
    cpu_throttle: tuple[float, float] = (90.0, 75.0)
    memory_throttle: tuple[float, float] = (90.0, 80.0)
    memory_unhealthy: tuple[float, float] = (97.0, 90.0)
    # Others' GPU memory use throttles like RAM (the host yields to a user's game or another
    # team's job) but never makes the host unhealthy: a full GPU fails the next allocation on that
    # GPU, not the machine. Grid's own engines fill VRAM by design and are not counted.
    gpu_memory_throttle: tuple[float, float] = (90.0, 80.0)
    temperature_throttle: tuple[float, float] = (85.0, 75.0)
    temperature_unhealthy: tuple[float, float] = (95.0, 85.0)
    # Battery: on battery -> throttled; below (entry) percent on battery -> paused, leave above recovery.
    battery_pause: tuple[float, float] = (20.0, 30.0)
    throttle_on_battery: bool = True
    # Employee machines: a user active within this many seconds throttles the host. None = ignore.
    user_active_seconds: float | None = None
    unknown_throttles: bool = False
    debounce_samples: int = 3
    recovery_samples: int = 3
    recovery_cooldown_seconds: float = 30.0
    # Capacity fraction a throttled host offers (reported as resources.throttle_fraction).
    throttle_fraction: float = 0.5


class Override(msgspec.Struct, frozen=True, kw_only=True):
    """A durable operator override (see grid.agent.overrides)."""

    state: str
    reason: str = ""
    set_at: float = 0.0
    # Wall-clock expiry; None = until resumed.
    expires_at: float | None = None


class ProtectionStatus(msgspec.Struct, frozen=True, kw_only=True):
    state: str = "accepting"
    reason: str = REASON_NOMINAL
    # The sensor-derived state (before overrides) and the debounce bookkeeping behind it.
    sensor_state: str = "accepting"
    sensor_reason: str = REASON_NOMINAL
    pending_state: str | None = None
    pending_reason: str = ""
    pending_count: int = 0
    recovery_count: int = 0
    entered_at: float = 0.0
    override: str | None = None


class Transition(msgspec.Struct, frozen=True, kw_only=True):
    """A change of the host's protection state from one `step` (logged as a ProtectionTransition)."""

    from_state: str
    to_state: str
    reason: str
    override: bool = False


def stricter(a: str, b: str) -> str:
    return a if SEVERITY[a] >= SEVERITY[b] else b


def _level(value: float | None, thresholds: tuple[float, float], holding: bool, *, above: bool = True) -> bool | None:
    """Whether a metric asks for its level. `holding`: the host is already at/above that level."""
    if value is None:
        return None
    entry, recovery = thresholds
    if above:
        return value >= recovery if holding else value >= entry
    return value <= recovery if holding else value <= entry


def sensor_target(policy: ProtectionPolicy, sample: SensorSample, current: str) -> tuple[str, str]:
    """The state the sensors ask for, with hysteresis relative to the current sensor state."""
    cur = SEVERITY[current]
    holding_unhealthy = cur >= SEVERITY["unhealthy"]
    holding_paused = cur >= SEVERITY["paused"]
    holding_throttled = cur >= SEVERITY["throttled"]
    candidates: list[tuple[str, str]] = []
    unknown = False

    mem_crit = _level(sample.memory_percent, policy.memory_unhealthy, holding_unhealthy)
    temp_crit = _level(sample.temperature_c, policy.temperature_unhealthy, holding_unhealthy)
    if mem_crit:
        candidates.append(("unhealthy", REASON_MEMORY_CRITICAL))
    if temp_crit:
        candidates.append(("unhealthy", REASON_TEMPERATURE_CRITICAL))

    if sample.power_plugged is False:
        low = _level(sample.battery_percent, policy.battery_pause, holding_paused, above=False)
        if low:
            candidates.append(("paused", REASON_BATTERY_LOW))
        elif policy.throttle_on_battery:
            candidates.append(("throttled", REASON_ON_BATTERY))

    for value, thresholds, reason in (
        (sample.cpu_percent, policy.cpu_throttle, REASON_CPU_HIGH),
        (sample.memory_percent, policy.memory_throttle, REASON_MEMORY_HIGH),
        (sample.temperature_c, policy.temperature_throttle, REASON_TEMPERATURE_HIGH),
    ):
        hit = _level(value, thresholds, holding_throttled)
        if hit is None:
            unknown = True
        elif hit:
            candidates.append(("throttled", reason))

    # Most hosts have no discrete GPU, so an unknown GPU reading is no opinion: it neither
    # throttles nor counts as a missing sensor for `unknown_throttles`.
    if _level(sample.gpu_memory_percent, policy.gpu_memory_throttle, holding_throttled):
        candidates.append(("throttled", REASON_GPU_MEMORY_HIGH))

    if policy.user_active_seconds is not None:
        idle = sample.user_idle_seconds
        if idle is None:
            unknown = True
        elif idle < policy.user_active_seconds:
            candidates.append(("throttled", REASON_USER_ACTIVE))

    if not candidates and unknown and policy.unknown_throttles:
        candidates.append(("throttled", REASON_SENSOR_UNKNOWN))
    if not candidates:
        return "accepting", REASON_NOMINAL
    # Strictest first; ties broken by the order the checks were written in (stable sort).
    candidates.sort(key=lambda c: -SEVERITY[c[0]])
    return candidates[0]


def step(
    policy: ProtectionPolicy,
    status: ProtectionStatus,
    sample: SensorSample,
    override: Override | None,
    now: float,
) -> tuple[ProtectionStatus, Transition | None]:
    """Fold one sample (and the currently active override) into the protection status."""
    target, target_reason = sensor_target(policy, sample, status.sensor_state)
    sensor_state, sensor_reason = status.sensor_state, status.sensor_reason
    pending_state, pending_count = status.pending_state, status.pending_count
    pending_reason = status.pending_reason
    recovery_count, entered_at = status.recovery_count, status.entered_at

    if SEVERITY[target] > SEVERITY[sensor_state]:
        recovery_count = 0
        # Count consecutive samples asking for something stricter; escalate to the mildest
        # state every sample in the streak agreed on.
        if pending_state is None:
            pending_state, pending_reason, pending_count = target, target_reason, 1
        else:
            if SEVERITY[target] < SEVERITY[pending_state]:
                pending_state, pending_reason = target, target_reason
            pending_count += 1
        if pending_count >= policy.debounce_samples:
            sensor_state, sensor_reason = pending_state, pending_reason
            entered_at = now
            pending_state, pending_reason, pending_count = None, "", 0
    elif SEVERITY[target] < SEVERITY[sensor_state]:
        pending_state, pending_reason, pending_count = None, "", 0
        recovery_count += 1
        if recovery_count >= policy.recovery_samples and now - entered_at >= policy.recovery_cooldown_seconds:
            sensor_state, sensor_reason = target, target_reason
            recovery_count = 0
            entered_at = now
    else:
        pending_state, pending_reason, pending_count, recovery_count = None, "", 0, 0
        sensor_reason = target_reason

    state, reason = sensor_state, sensor_reason
    override_state = override.state if override is not None and override.state in OVERRIDE_STATES else None
    by_override = False
    if override_state is not None and SEVERITY[override_state] >= SEVERITY[state]:
        state = override_state
        reason = f"{REASON_OVERRIDE_PREFIX}:{override_state}" + (f": {override.reason}" if override and override.reason else "")
        by_override = True

    new = ProtectionStatus(
        state=state,
        reason=reason,
        sensor_state=sensor_state,
        sensor_reason=sensor_reason,
        pending_state=pending_state,
        pending_reason=pending_reason,
        pending_count=pending_count,
        recovery_count=recovery_count,
        entered_at=entered_at,
        override=override_state,
    )
    transition = None
    if state != status.state:
        transition = Transition(from_state=status.state, to_state=state, reason=reason, override=by_override)
    return new, transition


def admits_new_work(state: str) -> bool:
    return state in ("accepting", "throttled")
