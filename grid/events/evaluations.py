"""Authenticated quality evaluations: how well a model did on a workload, recorded by the owner.

Only the operator (owner) credential may append these (the admin API's operator token, or the
operator's NATS identity publishing on ``grid.ctl.>``); the gateway cannot, so inference traffic
can never pose as quality evidence. No prompt, answer or user identity: counts, a score, a
latency and the artifact revision the evidence is about.
"""

from __future__ import annotations

from grid.events.base import Event


class EvaluationRecorded(Event, frozen=True, kw_only=True, tag="control.evaluation_recorded.v1"):
    model_id: str
    workload: str
    # Fraction passed, 0..1 (passed / total when counts were given).
    score: float
    # How many evaluations this submission stands for (total, or 1 for a bare score).
    samples: int = 1
    passed: int | None = None
    total: int | None = None
    latency_ms: float | None = None
    # The configured revision the evidence applies to (lowercase hex; None: the profile names none).
    artifact_sha256: str | None = None
