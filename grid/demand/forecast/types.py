"""The forecast's values: its configuration, one row per model and per workload, the ranked
candidates a workload row shows, and the ``Forecast`` itself."""

from __future__ import annotations

from grid.demand.affinity import SequenceEdge, SequencePrediction
from grid.demand.correlation import CorrelationEdge
from grid.demand.forecast.reasons import REASON_IDLE, WORKLOAD_IDLE
from grid.fleet import AUTHORITATIVE_SAMPLES
from grid.fleet.planning import DemandTarget
from grid.fleet.views import Value


FORECAST_VERSION = "forecast-1"


class ForecastConfig(Value, frozen=True, kw_only=True):
    ewma_alpha: float = 0.3
    trend_buckets: int = 6
    max_lookahead_seconds: float = 300.0
    max_growth: float = 2.0
    min_offered: float = 0.01
    queue_pressure: float = 0.5
    min_latency_samples: int = 3
    error_pressure_ratio: float = 0.05
    pressure_buckets: int = 2
    # Scale-down band: a held replica stays desired while the cooldown window's peak would need
    # it at this fraction of the scale-up utilization (scale up above 0.7 per replica, release
    # only below 0.7 x hold_band), so demand hovering at a boundary does not flap a replica.
    hold_band: float = 0.7
    evidence_observations: int = 3
    evidence_concurrency: float = 1.5
    gate_buckets: int = 15
    service_prior_samples: float = 8.0
    authoritative_timing_samples: int = AUTHORITATIVE_SAMPLES


class ModelForecast(Value, frozen=True, kw_only=True):
    model_id: str
    target: int = 0
    evidence: str = ""  # baseline | direct | inferred | "" (nothing desired)
    canary: bool = False
    reason: str = REASON_IDLE
    observed_rate: float = 0.0  # req/s, direct only (inferred demand never lands here)
    ewma: float = 0.0
    trend: float = 0.0  # raw least-squares slope, req/s per second (may be negative)
    rate: float = 0.0  # forecast direct req/s including the positive trend / lookahead
    lookahead_seconds: float = 0.0
    service_seconds: float = 0.0
    offered_concurrency: float = 0.0  # total used for the target
    direct_offered: float = 0.0
    workload_offered: float = 0.0
    inferred_rate: float = 0.0
    inferred_offered: float = 0.0
    peak_rate: float = 0.0
    p95_ms: float | None = None
    latency_slo_ms: float | None = None
    errors: int = 0
    error_ratio: float = 0.0
    queue: float = 0.0
    requests: int = 0  # requests in the retained window
    ready: int = 0
    last_seen: float | None = None
    hold_until: float | None = None
    workloads: tuple[str, ...] = ()


class ModelCandidate(Value, frozen=True, kw_only=True):
    model_id: str
    suitability: float
    score: float
    confidence: float
    quality_confidence: float
    samples: float
    quality_samples: float
    bonus: float
    validated: bool
    ready: int = 0
    service_age_seconds: float | None = None
    quality_age_seconds: float | None = None


class WorkloadForecast(Value, frozen=True, kw_only=True):
    workload: str
    status: str = WORKLOAD_IDLE
    gate: str = ""
    observations: int = 0
    observed_rate: float = 0.0
    rate: float = 0.0
    trend: float = 0.0
    service_seconds: float = 0.0
    offered_concurrency: float = 0.0
    projected_concurrency: float = 0.0  # offered without the unserved queue
    queue: float = 0.0
    errors: int = 0
    p95_ms: float | None = None
    model_id: str | None = None
    replicas: int = 0
    canary: bool = False
    sequence_source: str | None = None
    sequence_confidence: float = 0.0
    # The bonus-ranked leader when it differs from model_id; exploring=True when this
    # workload holds the forecast's single exploration canary.
    explore_model_id: str | None = None
    exploring: bool = False
    candidates: tuple[ModelCandidate, ...] = ()
    # The independent (exploitation) choice, and joint=True when the joint portfolio search
    # (grid.demand.portfolio) projected this workload onto a different model_id instead.
    independent_model_id: str | None = None
    joint: bool = False


class Forecast(Value, frozen=True, kw_only=True):
    version: str = FORECAST_VERSION
    now: float
    bucket_seconds: float
    window_buckets: int
    evidence_observations: int
    evidence_concurrency: float
    targets: tuple[DemandTarget, ...] = ()
    models: tuple[ModelForecast, ...] = ()
    workloads: tuple[WorkloadForecast, ...] = ()
    correlations: tuple[CorrelationEdge, ...] = ()
    sequences: tuple[SequenceEdge, ...] = ()
    predictions: tuple[SequencePrediction, ...] = ()
    ignored_requests: int = 0
