"""Inferred demand: quiet models that correlate with models in current direct demand
(:mod:`grid.demand.correlation`) get ``evidence="inferred"`` prewarm targets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from grid.demand import correlation as correlation_mod
from grid.demand.correlation import CorrelationEdge
from grid.demand.fold import DemandState
from grid.demand.forecast.series import SeriesStats
from grid.events.control import ModelProfile


def inferred_demand(
    demand: DemandState, live: Sequence[ModelProfile], stats: Mapping[str, SeriesStats], now: float,
) -> tuple[dict[str, correlation_mod.Inference], tuple[CorrelationEdge, ...]]:
    """Correlation: quiet targets inferred from models with direct current demand."""
    source_rates: dict[str, float] = {}
    quiet: list[str] = []
    for p in live:
        m = p.model_id
        st = stats[m]
        if st.recent > 0 and st.observed > 0:
            source_rates[m] = st.observed
        elif max(p.max_replicas, p.min_replicas) > 0:
            quiet.append(m)
    return correlation_mod.infer(demand, now, source_rates, quiet)
