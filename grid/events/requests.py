"""Bounded request features. Never a prompt, a response, a raw affinity key or a user identity."""

from __future__ import annotations

from typing import Literal

from grid.events.base import Event, Record

Outcome = Literal["ok", "error", "rejected", "unavailable", "timeout", "cancelled"]
WORKLOADS: tuple[str, ...] = (
    "coding", "research", "marketing", "sales", "design", "image", "video", "embedding", "general",
)
MAX_BATCH_RECORDS = 512


class RequestFeatures(Record, frozen=True, kw_only=True):
    endpoint: str  # chat | completions | embeddings | image | video
    requested_model: str
    served_model: str | None = None
    host_id: str | None = None
    modality: str = "text"
    input_units: int = 0
    output_units: int = 0
    workload: str = "general"
    service_seconds: float = 0.0
    queue_seconds: float = 0.0
    queue_depth: int = 0
    outcome: Outcome = "ok"
    status_code: int = 200
    finished_at: float = 0.0
    # Routed by model "auto": the served model is the router's choice, never direct demand.
    auto: bool = False
    # Double-hashed affinity key (hex), only for workload-sequence learning.
    affinity: str | None = None
    artifact_sha256: str | None = None
    evaluation: bool = False
    streamed: bool = False


class RequestCompleted(Event, frozen=True, kw_only=True, tag="request.completed.v1"):
    features: RequestFeatures


class RequestFailed(Event, frozen=True, kw_only=True, tag="request.failed.v1"):
    features: RequestFeatures


class RequestBatch(Event, frozen=True, kw_only=True, tag="request.batch.v1"):
    """Many bounded records in one log entry, flushed by size or within a second."""

    source: str
    records: tuple[RequestFeatures, ...]
