"""The scorers' measures: pure functions of what a scorer reads, each bounded to 0..100.

Kubernetes scheduler-framework habit: a measure only says how good one thing is on a 0..100
scale; which scorers a plan uses, their weights (and their signs: penalties have negative
weights) and what each reads of the plan are policy, written once in ``scorers.SCORERS``. The
two performance scorers are multiplied by a bounded concurrency boost (1..8x) when offered
concurrency exceeds one replica's target capacity.
"""

from __future__ import annotations

import math

from grid.events.control import ModelProfile
from grid.fleet import AUTHORITATIVE_SAMPLES
from grid.fleet.planning import DemandTarget, TimingSample

MAX_BOOST = 8.0
# Startup seconds at which the startup scorer gives 50.
STARTUP_REFERENCE_SECONDS = 60.0
MAX_VALID_SECONDS = 3600.0


def _clamp(x: float) -> float:
    if math.isnan(x):
        return 0.0
    return 0.0 if x < 0.0 else min(x, 100.0)


def valid_tps(x: float | None) -> float | None:
    """A usable tokens/s measurement (finite and positive), else None."""
    if x is None or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0.0:
        return None
    return float(x)


def score_resident(state: str | None) -> float:
    return {"ready": 100.0, "warming": 70.0, "loading": 50.0}.get(state or "", 0.0)


def score_cached(cached: bool) -> float:
    return 100.0 if cached else 0.0


def score_domain(new_domain: bool) -> float:
    return 100.0 if new_domain else 0.0


def score_throughput(tps: float | None, max_tps: float) -> float:
    if tps is None or max_tps <= 0.0:
        return 0.0
    return _clamp(100.0 * tps / max_tps)


def score_hardware(
    bandwidth: float | None, gflops: float | None, max_bw: float, max_gflops: float
) -> float:
    """Whole points only: hosts with near-identical hardware share a class (and a score)."""
    s = 0.0
    if bandwidth and max_bw > 0.0:
        s += 60.0 * min(1.0, bandwidth / max_bw)
    if gflops and max_gflops > 0.0:
        s += 40.0 * min(1.0, gflops / max_gflops)
    return float(round(_clamp(s)))


def score_fit(free_mb: float, mem_mb: float, scale_mb: float) -> float:
    """100 when the placement fills the host's remaining desired capacity exactly.

    ``scale_mb`` is fleet-wide (the largest new-work allocatable memory), not the host's own
    capacity, so the score is monotone in free memory across hosts of different sizes."""
    if scale_mb <= 0:
        return 0.0
    leftover = max(0.0, free_mb - mem_mb)
    return _clamp(100.0 * (1.0 - leftover / scale_mb))


def score_startup(seconds: float) -> float:
    seconds = max(0.0, seconds)
    return _clamp(
        100.0 * STARTUP_REFERENCE_SECONDS / (STARTUP_REFERENCE_SECONDS + seconds)
    )


def score_sticky(within_min_residency: bool) -> float:
    return 100.0 if within_min_residency else 0.0


def score_scarcity(constrained_eligible: int | None, own_eligible: int) -> float:
    """Penalty (0..100) for a flexible model on a host a more constrained model needs."""
    if (
        constrained_eligible is None
        or own_eligible <= 1
        or constrained_eligible >= own_eligible
    ):
        return 0.0
    return _clamp(100.0 * (1.0 - constrained_eligible / own_eligible))


def score_load(level: int) -> float:
    return _clamp(25.0 * level)


def score_throttled(throttled: bool) -> float:
    return 100.0 if throttled else 0.0


def score_failed(failed: bool) -> float:
    return 100.0 if failed else 0.0


def score_pending(pending: bool) -> float:
    return 100.0 if pending else 0.0


def concurrency_boost(profile: ModelProfile, demand: DemandTarget | None) -> float:
    """1..8: how far offered concurrency exceeds one replica's target capacity."""
    if demand is None or not math.isfinite(demand.offered_concurrency):
        return 1.0
    per_replica = max(
        1e-9,
        max(1, profile.replica_concurrency) * max(0.01, profile.target_utilization),
    )
    return min(MAX_BOOST, max(1.0, demand.offered_concurrency / per_replica))


def _valid_seconds(x: float | None) -> float | None:
    if x is None or not math.isfinite(x) or x < 0.0 or x > MAX_VALID_SECONDS:
        return None
    return x


def startup_seconds(
    profile: ModelProfile, sample: TimingSample | None, cached: bool, sha: str | None
) -> float:
    """Learned load+warm (blended toward the profile prior until authoritative); a cached
    artifact skips the load phase. A sample for a different artifact revision is ignored."""
    load = float(profile.load_seconds)
    warm = float(profile.warm_seconds)
    if sample is not None and sample.samples > 0:
        same_rev = sha is None or (sample.artifact_sha256 or "").lower() == sha
        if same_rev:
            w = min(sample.samples, AUTHORITATIVE_SAMPLES) / AUTHORITATIVE_SAMPLES
            sl = _valid_seconds(sample.load_seconds)
            sw = _valid_seconds(sample.warm_seconds)
            if sl is not None:
                load = w * sl + (1.0 - w) * load
            if sw is not None:
                warm = w * sw + (1.0 - w) * warm
    return warm if cached else load + warm
