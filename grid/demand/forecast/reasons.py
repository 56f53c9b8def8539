"""The forecast's reason constants: why a model's target is what it is (joined with "+" in
``DemandTarget.reason`` / ``ModelForecast.reason``), and how a workload was admitted."""

from __future__ import annotations


# Reason constants (joined with "+" in DemandTarget.reason / ModelForecast.reason).
REASON_DIRECT = "direct_load"
REASON_LOOKAHEAD = "rising_lookahead"
REASON_QUEUE = "queue_pressure"
REASON_LATENCY = "latency_pressure"
REASON_ERRORS = "error_pressure"
REASON_HOLD = "cooldown_hold"
REASON_BASELINE = "min_replicas"
REASON_MAX = "max_replicas"
REASON_WORKLOAD = "workload"  # workload:<name>
REASON_CANARY = "canary"
REASON_CORRELATION = "correlation"  # correlation:<kind>:<source>
REASON_SEQUENCE = "sequence"  # sequence:<src>-><dst>@<confidence>
REASON_EXPLORE = "explore"  # explore:<workload>: the single exploration canary
REASON_IDLE = "idle"

# Workload admission reasons.
GATE_OBSERVATIONS = "observations"
GATE_CONCURRENCY = "concurrency"
GATE_SEQUENCE = "sequence"
WORKLOAD_BELOW_GATE = "below_evidence_gate"
WORKLOAD_NO_CANDIDATE = "no_candidate"
WORKLOAD_ADMITTED = "admitted"
WORKLOAD_IDLE = "idle"
