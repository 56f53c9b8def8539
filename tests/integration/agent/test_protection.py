"""The local protection loop as a pure function of injected sensor readings."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from grid.agent.overrides import active_override, make_override
from grid.agent.protection import (
    SEVERITY,
    STATE_ORDER,
    Override,
    ProtectionPolicy,
    ProtectionStatus,
    SensorSample,
    admits_new_work,
    sensor_target,
    step,
)

POLICY = ProtectionPolicy(debounce_samples=3, recovery_samples=3, recovery_cooldown_seconds=10.0)
CALM = SensorSample(cpu_percent=10.0, memory_percent=40.0, temperature_c=50.0)
HOT = SensorSample(cpu_percent=10.0, memory_percent=40.0, temperature_c=99.0)
WARM = SensorSample(cpu_percent=10.0, memory_percent=40.0, temperature_c=88.0)  # throttle band
BUSY = SensorSample(cpu_percent=95.0, memory_percent=40.0, temperature_c=50.0)


def run(samples, *, policy=POLICY, status=None, override=None, start=0.0, dt=1.0):
    status = status or ProtectionStatus()
    states, transitions = [], []
    now = start
    for sample in samples:
        status, tr = step(policy, status, sample, override, now)
        states.append(status.state)
        if tr:
            transitions.append(tr)
        now += dt
    return status, states, transitions


def test_single_spike_is_debounced():
    _, states, transitions = run([CALM, BUSY, BUSY, CALM, BUSY, CALM])
    assert set(states) == {"accepting"}
    assert transitions == []


def test_three_consecutive_samples_throttle():
    status, states, transitions = run([BUSY, BUSY, BUSY])
    assert states == ["accepting", "accepting", "throttled"]
    assert transitions[0].reason == "cpu_high"
    assert status.state == "throttled" and admits_new_work("throttled")


def test_critical_temperature_makes_host_unhealthy():
    status, states, transitions = run([HOT, HOT, HOT])
    assert states[-1] == "unhealthy"
    assert transitions[-1].reason == "temperature_critical"
    assert not admits_new_work(status.state)


def test_hysteresis_holds_between_recovery_and_entry_thresholds():
    status, _, _ = run([BUSY] * 3)
    assert status.state == "throttled"
    # 80% is below entry (90) but above recovery (75): the host stays throttled indefinitely.
    between = SensorSample(cpu_percent=80.0, memory_percent=40.0, temperature_c=50.0)
    status, states, _ = run([between] * 20, status=status, start=100.0)
    assert set(states) == {"throttled"}
    # Below recovery: recovers after recovery_samples (cooldown already elapsed).
    status, states, transitions = run([CALM] * 3, status=status, start=200.0)
    assert states == ["throttled", "throttled", "accepting"]
    assert transitions[-1].to_state == "accepting"


def test_recovery_waits_for_cooldown():
    status, _, _ = run([HOT] * 3, start=0.0)  # unhealthy entered at t=2
    assert status.state == "unhealthy"
    # Calm samples at t=3..8: enough samples but inside the 10 s cooldown.
    status, states, _ = run([CALM] * 6, status=status, start=3.0)
    assert set(states) == {"unhealthy"}
    status, states, _ = run([CALM] * 3, status=status, start=13.0)
    assert states[-1] == "accepting"


def test_recovery_from_unhealthy_steps_through_throttled():
    status, _, _ = run([HOT] * 3)
    # 88 C is still above the unhealthy recovery threshold (85): no recovery at all.
    status, states, _ = run([WARM] * 5, status=status, start=50.0)
    assert set(states) == {"unhealthy"}
    # 80 C: below the unhealthy recovery threshold but above the throttle recovery (75).
    cooling = SensorSample(cpu_percent=10.0, memory_percent=40.0, temperature_c=80.0)
    status, states, _ = run([cooling] * 3, status=status, start=100.0)
    assert states[-1] == "throttled"


def test_unknown_sensors_are_not_zero():
    unknown = SensorSample()
    _, states, _ = run([unknown] * 5)
    assert set(states) == {"accepting"}
    cautious = ProtectionPolicy(debounce_samples=1, unknown_throttles=True)
    status, _, transitions = run([unknown], policy=cautious)
    assert status.state == "throttled" and transitions[0].reason == "sensor_unknown"


def test_battery_low_pauses_and_charging_recovers():
    on_battery_low = SensorSample(cpu_percent=5.0, memory_percent=30.0, battery_percent=12.0, power_plugged=False)
    status, states, _ = run([on_battery_low] * 3)
    assert states[-1] == "paused"
    on_battery_ok = SensorSample(cpu_percent=5.0, memory_percent=30.0, battery_percent=25.0, power_plugged=False)
    # 25% is above the pause entry (20) but below its recovery (30): still paused.
    status, states, _ = run([on_battery_ok] * 5, status=status, start=100.0)
    assert set(states) == {"paused"}
    plugged = SensorSample(cpu_percent=5.0, memory_percent=30.0, battery_percent=25.0, power_plugged=True)
    status, states, _ = run([plugged] * 3, status=status, start=200.0)
    assert states[-1] == "accepting"


def test_user_activity_throttles_employee_machines_only():
    active_user = SensorSample(cpu_percent=5.0, memory_percent=30.0, temperature_c=40.0, user_idle_seconds=3.0)
    _, states, _ = run([active_user] * 3)
    assert states[-1] == "accepting"  # dedicated default ignores the user
    employee = ProtectionPolicy(debounce_samples=3, user_active_seconds=60.0)
    _, states, transitions = run([active_user] * 3, policy=employee)
    assert states[-1] == "throttled" and transitions[-1].reason == "user_active"


def test_override_applies_immediately_and_resume_releases():
    drain = Override(state="draining", reason="taking laptop home")
    status, states, transitions = run([CALM], override=drain)
    assert states == ["draining"]
    assert transitions[0].override and "taking laptop home" in transitions[0].reason
    status, states, transitions = run([CALM], status=status, override=None)
    assert states == ["accepting"] and not transitions[0].override


def test_confirmed_local_safety_outranks_override_and_resume():
    # A hot machine: neither a (weaker) drain override nor a resume makes it accept work.
    status, _, _ = run([HOT] * 3)
    status, states, _ = run([HOT] * 3, status=status, override=Override(state="draining"))
    assert set(states) == {"unhealthy"}
    status, states, _ = run([HOT] * 3, status=status, override=None)
    assert set(states) == {"unhealthy"}
    # Quarantine is stricter than unhealthy and does win.
    status, states, _ = run([HOT], status=status, override=Override(state="quarantined"))
    assert states == ["quarantined"]


def test_override_expiry():
    ovr = make_override("pause", reason="battery", now=1000.0, for_seconds=60)
    assert active_override(ovr, 1059.0) == ovr
    assert active_override(ovr, 1060.0) is None
    forever = make_override("quarantine", reason="", now=1000.0, for_seconds=None)
    assert active_override(forever, 1e12) == forever


readings = st.builds(
    SensorSample,
    cpu_percent=st.one_of(st.none(), st.floats(0, 100)),
    memory_percent=st.one_of(st.none(), st.floats(0, 100)),
    temperature_c=st.one_of(st.none(), st.floats(20, 110)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(readings, min_size=1, max_size=60))
def test_escalation_needs_debounce_and_recovery_needs_cooldown(samples):
    status = ProtectionStatus()
    for i, sample in enumerate(samples):
        before = status
        status, tr = step(POLICY, status, sample, None, float(i))
        if status.sensor_state != before.sensor_state:
            if SEVERITY[status.sensor_state] > SEVERITY[before.sensor_state]:
                # Escalation only after `debounce_samples` consecutive stricter samples.
                assert before.pending_count == POLICY.debounce_samples - 1
            else:
                # Recovery only after the cooldown since the stricter state was entered.
                assert float(i) - before.entered_at >= POLICY.recovery_cooldown_seconds
        if tr is not None:
            assert tr.from_state != tr.to_state
        assert status.state == status.sensor_state  # no override in play


# --- GPU memory pressure: judged like RAM's throttle level; unknown is no opinion --------------

def test_gpu_memory_pressure_throttles_with_hysteresis():
    full_gpu = SensorSample(cpu_percent=10.0, memory_percent=40.0, temperature_c=50.0, gpu_memory_percent=95.0)
    status, states, transitions = run([full_gpu] * 3)
    assert states == ["accepting", "accepting", "throttled"]
    assert transitions[-1].reason == "gpu_memory_high"
    # Between the recovery (80) and entry (90) thresholds the host holds; below recovery it recovers.
    between = SensorSample(cpu_percent=10.0, memory_percent=40.0, temperature_c=50.0, gpu_memory_percent=85.0)
    status, states, _ = run([between] * 5, status=status, start=100.0)
    assert set(states) == {"throttled"}
    calm_gpu = SensorSample(cpu_percent=10.0, memory_percent=40.0, temperature_c=50.0, gpu_memory_percent=20.0)
    _, states, transitions = run([calm_gpu] * 3, status=status, start=200.0)
    assert states[-1] == "accepting" and transitions[-1].reason == "nominal"


def test_full_gpu_never_makes_the_host_unhealthy():
    # A full GPU fails the next allocation on it, not the machine: throttled at most.
    status, states, _ = run([SensorSample(gpu_memory_percent=100.0)] * 10)
    assert set(states[2:]) == {"throttled"} and status.sensor_reason == "gpu_memory_high"


def test_unknown_gpu_memory_does_not_count_as_a_missing_sensor():
    cautious = ProtectionPolicy(debounce_samples=1, unknown_throttles=True)
    _, states, _ = run([CALM], policy=cautious)  # every relied-on sensor known, no GPU
    assert states == ["accepting"]


gpu_free_readings = st.builds(
    SensorSample,
    cpu_percent=st.one_of(st.none(), st.floats(0, 100)),
    memory_percent=st.one_of(st.none(), st.floats(0, 100)),
    temperature_c=st.one_of(st.none(), st.floats(20, 110)),
    battery_percent=st.one_of(st.none(), st.floats(0, 100)),
    power_plugged=st.one_of(st.none(), st.booleans()),
    user_idle_seconds=st.one_of(st.none(), st.floats(0, 1e5)),
)
policies = st.builds(
    ProtectionPolicy,
    debounce_samples=st.integers(1, 4),
    recovery_samples=st.integers(1, 4),
    recovery_cooldown_seconds=st.floats(0, 20),
    unknown_throttles=st.booleans(),
    user_active_seconds=st.one_of(st.none(), st.floats(1, 600)),
)


def _with_gpu(sample: SensorSample, gpu: float | None) -> SensorSample:
    return msgspec.structs.replace(sample, gpu_memory_percent=gpu)


@settings(max_examples=200, deadline=None)
@given(policies, st.lists(gpu_free_readings, min_size=1, max_size=40), st.floats(0, 79.9))
def test_unknown_gpu_memory_decides_exactly_like_a_calm_gpu(policy, samples, calm):
    # No opinion: whatever the other sensors and the policy (even `unknown_throttles`), a host
    # whose GPU memory is unknown goes through the same states as one whose GPU is calm.
    unknown_run = run([_with_gpu(s, None) for s in samples], policy=policy)[1]
    calm_run = run([_with_gpu(s, calm) for s in samples], policy=policy)[1]
    assert unknown_run == calm_run


@settings(max_examples=300, deadline=None)
@given(policies, gpu_free_readings, st.floats(90.0, 100.0), st.sampled_from(STATE_ORDER[:5]))
def test_gpu_pressure_never_asks_for_a_less_protective_state(policy, sample, gpu, current):
    without = sensor_target(policy, sample, current)[0]
    with_pressure = sensor_target(policy, _with_gpu(sample, gpu), current)[0]
    assert SEVERITY[with_pressure] >= max(SEVERITY[without], SEVERITY["throttled"])
    # And without pressure the unknown reading asks for exactly what it asked before.
    assert sensor_target(policy, _with_gpu(sample, None), current)[0] == without
