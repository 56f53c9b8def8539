"""Demand forecast: bounded demand history -> desired replicas per configured model.

``forecast(demand, profiles, now, ...)`` is pure (explicit ``now``, sorted iteration, no I/O).
Its ``targets`` feed ``PlannerInput.demand``; its ``models`` / ``workloads`` rows are what
``gridctl status --json`` shows, each with its evidence and reason.

``forecast()`` (compose.py) runs three demand steps, then one combination per model:

1. direct demand (named-model requests; direct_demand.py): rate, trend, service time and
   pressure of each model's own series (series.py), sized into replicas (sizing.py) with a
   lookahead of the model's fastest start (start.py);
2. workload demand (automatic traffic; workload_demand.py): each workload projected onto its
   exploitation leader or the joint portfolio's choice, behind an evidence gate, with at most
   one exploration canary per forecast;
3. inferred demand (inferred_demand.py): correlation prewarms for quiet models (an
   affinity-sequence prediction admits its workload in step 2);
4. per model (model_forecast.py): the three combined into one target bounded by
   ``[min_replicas, max(max_replicas, min_replicas)]``, with hysteresis and the reasons the
   row shows (reasons.py).

The rows, targets and configuration are values (types.py). This package exports exactly the
names below; the modules' other names are its internals.
"""

from __future__ import annotations

from grid.demand.forecast.compose import forecast
from grid.demand.forecast.reasons import (
    GATE_CONCURRENCY,
    GATE_OBSERVATIONS,
    GATE_SEQUENCE,
    REASON_BASELINE,
    REASON_CANARY,
    REASON_CORRELATION,
    REASON_DIRECT,
    REASON_ERRORS,
    REASON_EXPLORE,
    REASON_HOLD,
    REASON_IDLE,
    REASON_LATENCY,
    REASON_LOOKAHEAD,
    REASON_MAX,
    REASON_QUEUE,
    REASON_SEQUENCE,
    REASON_WORKLOAD,
    WORKLOAD_ADMITTED,
    WORKLOAD_BELOW_GATE,
    WORKLOAD_IDLE,
    WORKLOAD_NO_CANDIDATE,
)
from grid.demand.forecast.types import (
    FORECAST_VERSION,
    ModelCandidate,
    Forecast,
    ForecastConfig,
    ModelForecast,
    WorkloadForecast,
)
from grid.demand.forecast.workload_demand import MAX_CANDIDATES_SHOWN


__all__ = [
    "FORECAST_VERSION",
    "GATE_CONCURRENCY",
    "GATE_OBSERVATIONS",
    "GATE_SEQUENCE",
    "MAX_CANDIDATES_SHOWN",
    "REASON_BASELINE",
    "REASON_CANARY",
    "REASON_CORRELATION",
    "REASON_DIRECT",
    "REASON_ERRORS",
    "REASON_EXPLORE",
    "REASON_HOLD",
    "REASON_IDLE",
    "REASON_LATENCY",
    "REASON_LOOKAHEAD",
    "REASON_MAX",
    "REASON_QUEUE",
    "REASON_SEQUENCE",
    "REASON_WORKLOAD",
    "WORKLOAD_ADMITTED",
    "WORKLOAD_BELOW_GATE",
    "WORKLOAD_IDLE",
    "WORKLOAD_NO_CANDIDATE",
    "ModelCandidate",
    "Forecast",
    "ForecastConfig",
    "ModelForecast",
    "WorkloadForecast",
    "forecast",
]
