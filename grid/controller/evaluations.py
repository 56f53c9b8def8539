"""What POST /allocator/evaluations accepts, and the event it becomes (pure).

The owner submits how a model did on a workload: ``passed`` of ``total`` (both, or neither) or a
bare ``score`` in [0, 1], an optional latency, and optionally the ``artifact_sha256`` the
evaluation ran against. An explicit digest must be the model's currently configured revision
(else 409 ``artifact_mismatch``): evidence about other weights must never be credited to these.
The event always records the configured revision, so a later artifact change starts uncertain.
Types bound every number (the OpenAPI schema shows the bounds); the checks here are the ones a
schema cannot express. Split from grid.controller.api, which keeps the route.
"""

from __future__ import annotations

import math
import re
from typing import Annotated

import msgspec

from grid.controller.admin_input import BodyError, validate_model_id
from grid.events.base import new_event_id
from grid.events.control import ModelProfile
from grid.events.evaluations import EvaluationRecorded
from grid.events.requests import WORKLOADS

# One submission stands for at most this many evaluations (a benchmark run, not a flood).
MAX_EVALUATIONS = 10_000
MAX_LATENCY_MS = 3_600_000.0
ARTIFACT_MISMATCH = "artifact_mismatch"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_EVALUATIONS)]
Score = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
Latency = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_LATENCY_MS)]


class EvaluationBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One quality evaluation of a configured model on a workload."""

    model_id: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    workload: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    passed: Count | None = None
    total: Count | None = None
    score: Score | None = None
    latency_ms: Latency | None = None
    artifact_sha256: Annotated[str, msgspec.Meta(min_length=64, max_length=64)] | None = None


evaluation_decoder = msgspec.json.Decoder(EvaluationBody)


def _invalid(field: str, detail: str) -> BodyError:
    return BodyError(422, "validation_error", detail, field)


def validate_body(body: EvaluationBody) -> None:
    """Checks that need no catalog (the model's existence and revision are checked by `to_event`)."""
    validate_model_id(body.model_id)
    if body.workload not in WORKLOADS:
        raise _invalid("workload", f"workload must be one of {', '.join(WORKLOADS)}")
    counts = (body.passed is not None, body.total is not None)
    if counts[0] != counts[1]:
        raise _invalid("total" if counts[0] else "passed", "passed and total go together")
    if counts[0] and body.score is not None:
        raise _invalid("score", "give either passed and total, or score, not both")
    if not counts[0] and body.score is None:
        raise _invalid("score", "give passed and total, or score")
    if body.total is not None and body.passed is not None:
        if body.total < 1:
            raise _invalid("total", "must be >= 1")
        if body.passed > body.total:
            raise _invalid("passed", "must be <= total")
    if body.score is not None and not math.isfinite(body.score):
        raise _invalid("score", "must be a finite number in [0, 1]")
    if body.latency_ms is not None and not math.isfinite(body.latency_ms):
        raise _invalid("latency_ms", "must be a finite number")
    if body.artifact_sha256 is not None and not _SHA256.match(body.artifact_sha256.strip().lower()):
        raise _invalid("artifact_sha256", "must be 64 hexadecimal characters")


def to_event(body: EvaluationBody, profile: ModelProfile | None, at: float) -> EvaluationRecorded:
    """The event for a validated body, or BodyError: 404 without a profile, 409 on a revision mismatch."""
    if profile is None:
        raise BodyError(404, "unknown_model", f"no profile for {body.model_id!r}: evaluate a configured model",
                        "model_id")
    configured = profile.artifact_sha256.lower() if profile.artifact_sha256 else None
    if body.artifact_sha256 is not None:
        given = body.artifact_sha256.strip().lower()
        if configured is None:
            raise BodyError(409, ARTIFACT_MISMATCH,
                            f"{body.model_id!r} configures no artifact_sha256, so an evaluation naming "
                            f"{given[:12]}... cannot be matched to its weights", "artifact_sha256")
        if given != configured:
            raise BodyError(409, ARTIFACT_MISMATCH,
                            f"artifact_sha256 {given[:12]}... is not the configured revision "
                            f"{configured[:12]}... of {body.model_id!r}: evidence about other weights is refused",
                            "artifact_sha256")
    if body.passed is not None and body.total is not None:
        score, samples = body.passed / body.total, body.total
    else:
        score, samples = float(body.score or 0.0), 1
    return EvaluationRecorded(
        event_id=new_event_id(), at=at, model_id=body.model_id, workload=body.workload, score=score,
        samples=samples, passed=body.passed, total=body.total, latency_ms=body.latency_ms,
        artifact_sha256=configured,
    )
