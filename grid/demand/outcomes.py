"""Measured model/workload outcomes and the confidence they earn.

Evidence is keyed by (model, workload, artifact sha256): a replacement artifact starts
uncertain and a late response from the previous revision cannot update the new one.

* Service confidence reaches full weight after :data:`FULL_SERVICE_SAMPLES` fresh requests.
* Quality confidence reaches full weight after :data:`FULL_QUALITY_SAMPLES` fresh evaluations.
  Quality comes from the owner's authenticated evaluations (``EvaluationRecorded``, folded by
  :func:`record_evaluation`: ``passed`` of ``total`` count as that many evaluations), never from
  whether an inference request merely succeeded.
* Both decay with their own seven-day half-life, each against its own update time: a fresh
  latency-only request cannot revive stale quality.
* A six-point optimism bonus lets an equally suitable cold candidate earn a canary; it falls to
  zero as fresh service evidence accumulates.

The state lives inside the demand projection (it is folded from the same request events); the
functions here are pure. Times are log receipt times.
"""

from __future__ import annotations

import math

import msgspec

FULL_SERVICE_SAMPLES = 20.0
FULL_QUALITY_SAMPLES = 8.0
HALF_LIFE_SECONDS = 7 * 86_400.0
OPTIMISM_BONUS = 6.0
# A fresh success within this window validates a canary for (model, workload, artifact).
VALIDATION_SECONDS = 3_600.0
# Bounded: artifact revisions remembered per (model, workload), oldest update dropped first.
MAX_REVISIONS = 4
# Score weights (points on the 0..100 suitability scale).
FAILURE_PENALTY_POINTS = 40.0
QUALITY_POINTS = 20.0
LATENCY_PENALTY_POINTS = 10.0


class OutcomeStats(msgspec.Struct, kw_only=True, array_like=True):
    """Decayed counters for one (model, workload, artifact). Mutated in place by the fold."""

    n: float = 0.0  # decayed requests, as of `at`
    ok: float = 0.0  # decayed successes, as of `at`
    at: float = 0.0
    latency_ewma: float = 0.0  # seconds, over successes
    last_ok_at: float | None = None
    q_n: float = 0.0  # decayed evaluations, as of `q_at`
    q_ok: float = 0.0
    q_at: float = 0.0


class OutcomeView(msgspec.Struct, frozen=True, kw_only=True):
    model_id: str
    workload: str
    artifact_sha256: str
    samples: float = 0.0  # effective (decayed) request count
    confidence: float = 0.0
    success_rate: float = 1.0
    latency_seconds: float | None = None
    service_age_seconds: float | None = None
    quality_samples: float = 0.0
    quality_confidence: float = 0.0
    quality: float | None = None
    quality_age_seconds: float | None = None
    validated: bool = False
    bonus: float = OPTIMISM_BONUS


# model -> workload -> sha -> stats
Outcomes = dict[str, dict[str, dict[str, OutcomeStats]]]


def _decay(value: float, since: float, now: float) -> float:
    dt = now - since
    if dt <= 0.0 or value == 0.0:
        return value
    return value * math.pow(0.5, dt / HALF_LIFE_SECONDS)


def _stats(outcomes: Outcomes, model_id: str, workload: str, sha: str, at: float) -> OutcomeStats:
    by_workload = outcomes.get(model_id)
    if by_workload is None:
        by_workload = outcomes[model_id] = {}
    by_sha = by_workload.get(workload)
    if by_sha is None:
        by_sha = by_workload[workload] = {}
    stats = by_sha.get(sha)
    if stats is None:
        if len(by_sha) >= MAX_REVISIONS:
            oldest = min(by_sha, key=lambda k: (max(by_sha[k].at, by_sha[k].q_at), k))
            del by_sha[oldest]
        stats = by_sha[sha] = OutcomeStats(at=at, q_at=at)
    return stats


def record_evaluation(
    outcomes: Outcomes,
    model_id: str,
    workload: str,
    sha: str,
    *,
    passed: float,
    total: float,
    at: float,
) -> None:
    """Fold ``passed`` of ``total`` evaluations into the quality evidence (mutates ``outcomes``).

    Invalid counts (non-finite, negative, ``passed > total``, ``total == 0``) are ignored: the
    admin API refuses them, and a hand-made event must not poison the score either.
    """
    if not (math.isfinite(passed) and math.isfinite(total) and 0.0 <= passed <= total and total > 0.0):
        return
    stats = _stats(outcomes, model_id, workload, sha, at)
    if at > stats.q_at:
        f = math.pow(0.5, (at - stats.q_at) / HALF_LIFE_SECONDS)
        stats.q_n *= f
        stats.q_ok *= f
        stats.q_at = at
    stats.q_n += total
    stats.q_ok += passed


def record(
    outcomes: Outcomes,
    model_id: str,
    workload: str,
    sha: str,
    *,
    ok: bool,
    latency_seconds: float,
    evaluation: bool,
    at: float,
) -> None:
    """Fold one served request into ``outcomes`` (mutates; callers own the dict)."""
    if evaluation:
        record_evaluation(outcomes, model_id, workload, sha, passed=1.0 if ok else 0.0, total=1.0, at=at)
        return
    stats = _stats(outcomes, model_id, workload, sha, at)
    if at > stats.at:
        f = math.pow(0.5, (at - stats.at) / HALF_LIFE_SECONDS)
        stats.n *= f
        stats.ok *= f
        stats.at = at
    stats.n += 1.0
    if ok:
        stats.ok += 1.0
        if stats.last_ok_at is None or at > stats.last_ok_at:
            stats.last_ok_at = at
        if 0.0 < latency_seconds < 1e9:
            if stats.latency_ewma <= 0.0:
                stats.latency_ewma = latency_seconds
            else:
                stats.latency_ewma += 0.2 * (latency_seconds - stats.latency_ewma)


def view(outcomes: Outcomes, model_id: str, workload: str, sha: str | None, now: float) -> OutcomeView:
    """Confidence, quality confidence and remaining bonus for one candidate at ``now``."""
    key = sha or ""
    stats = outcomes.get(model_id, {}).get(workload, {}).get(key)
    if stats is None:
        return OutcomeView(model_id=model_id, workload=workload, artifact_sha256=key)
    n = _decay(stats.n, stats.at, now)
    ok = _decay(stats.ok, stats.at, now)
    q_n = _decay(stats.q_n, stats.q_at, now)
    q_ok = _decay(stats.q_ok, stats.q_at, now)
    confidence = min(1.0, n / FULL_SERVICE_SAMPLES)
    q_conf = min(1.0, q_n / FULL_QUALITY_SAMPLES)
    return OutcomeView(
        model_id=model_id,
        workload=workload,
        artifact_sha256=key,
        samples=n,
        confidence=confidence,
        success_rate=(ok / n) if n > 0 else 1.0,
        latency_seconds=stats.latency_ewma if stats.latency_ewma > 0 else None,
        service_age_seconds=max(0.0, now - stats.at) if stats.n > 0 else None,
        quality_samples=q_n,
        quality_confidence=q_conf,
        quality=(q_ok / q_n) if q_n > 0 else None,
        quality_age_seconds=max(0.0, now - stats.q_at) if stats.q_n > 0 else None,
        validated=stats.last_ok_at is not None and 0.0 <= now - stats.last_ok_at <= VALIDATION_SECONDS,
        bonus=OPTIMISM_BONUS * (1.0 - confidence),
    )


def suitability_points(score: float) -> float:
    """Configured workload score as points 0..100 (scores <= 1 are fractions, above are points)."""
    if not math.isfinite(score) or score <= 0.0:
        return 0.0
    return min(100.0, score * 100.0 if score <= 1.0 else score)


def candidate_score(suitability: float, outcome: OutcomeView, *, slo_seconds: float | None = None) -> float:
    """Suitability points adjusted by measured outcomes plus the decaying optimism bonus.

    Measured failures cost up to 40 points at full confidence, measured quality moves the
    score by up to +-10 points at full quality confidence, and a latency EWMA above the SLO
    costs up to 10 points. The bonus (<= 6 points) is smaller than meaningful suitability gaps.
    """
    score = suitability
    score -= FAILURE_PENALTY_POINTS * outcome.confidence * (1.0 - outcome.success_rate)
    if outcome.quality is not None:
        score += QUALITY_POINTS * outcome.quality_confidence * (outcome.quality - 0.5)
    if slo_seconds and outcome.latency_seconds is not None and outcome.latency_seconds > slo_seconds:
        over = min(1.0, outcome.latency_seconds / slo_seconds - 1.0)
        score -= LATENCY_PENALTY_POINTS * outcome.confidence * over
    return score + outcome.bonus


def prune(outcomes: Outcomes, configured) -> None:
    """Forget models that are no longer configured (bounded state)."""
    for model_id in [m for m in outcomes if m not in configured]:
        del outcomes[model_id]
