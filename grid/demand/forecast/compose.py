"""``forecast()``: the demand steps in order, then one combination per model."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from grid.demand import affinity as affinity_mod
from grid.demand.fold import DemandState
from grid.demand.forecast.direct_demand import direct_demand
from grid.demand.forecast.inferred_demand import inferred_demand
from grid.demand.forecast.model_forecast import model_forecast
from grid.demand.forecast.start import start_seconds
from grid.demand.forecast.types import Forecast, ForecastConfig, ModelForecast
from grid.demand.forecast.workload_demand import workload_demand
from grid.events.control import ModelProfile
from grid.fleet.planning import DemandTarget, TimingSample


def forecast(
    demand: DemandState,
    profiles: Sequence[ModelProfile],
    now: float,
    *,
    ready_replicas: Mapping[str, int] = {},
    ready_since: Mapping[str, Sequence[float | None]] = {},
    watermarks: Mapping[str, float] = {},
    fastest_start_seconds: Mapping[str, float] = {},
    timings: Sequence[TimingSample] = (),
    retired: frozenset[str] | Sequence[str] = frozenset(),
    config: ForecastConfig = ForecastConfig(),
    placeable: Collection[str] | None = None,
    portfolio: Mapping[str, str] | None = None,
) -> Forecast:
    """Desired replicas per configured, non-retired model at ``now`` (pure).

    Three demand steps (direct, workload, inferred), then one combination per model.
    ``placeable``: the models some host could ever hold (grid.planner.fleet_scan); workload
    demand is projected only onto those, so a model that fits nowhere never suppresses a
    usable fallback. None: every configured model is a candidate.
    ``ready_since``: per model, when each ready replica became ready (None: unknown, long ago);
    pressure then asks for one replica beyond those that were serving when it was measured.
    A model it does not name counts all its ready replicas as serving throughout.
    ``portfolio``: workload -> model chosen by the joint search (grid.demand.portfolio); a
    workload absent from it, or mapped to a model that is not its candidate, keeps its leader.
    """
    cfg = config
    retired_set = frozenset(retired)
    # One profile per id (the last given wins, deterministically by input order).
    by_id: dict[str, ModelProfile] = {}
    for p in profiles:
        if p.model_id not in retired_set:
            by_id[p.model_id] = p
    live = [by_id[m] for m in sorted(by_id)]
    starts = start_seconds(live, fastest_start_seconds, timings, cfg)

    stats = direct_demand(demand, live, starts, now, cfg)
    seq_preds = affinity_mod.predictions(demand.affinity, now)
    candidates = live if placeable is None else [p for p in live if p.model_id in placeable]
    claims, workload_rows = workload_demand(demand, candidates, by_id, starts, seq_preds, now, ready_replicas, cfg,
                                            portfolio or {})
    inferred, considered = inferred_demand(demand, live, stats, now)

    targets: list[DemandTarget] = []
    rows: list[ModelForecast] = []
    for p in live:
        m = p.model_id
        target, row = model_forecast(
            p, stats[m], claims.get(m), inferred.get(m), demand, now,
            ready=max(0, int(ready_replicas.get(m, 0))), watermark=watermarks.get(m), cfg=cfg,
            since=ready_since.get(m),
        )
        if target is not None:
            targets.append(target)
        rows.append(row)
    return Forecast(
        now=now,
        bucket_seconds=demand.bucket_seconds,
        window_buckets=demand.max_buckets,
        evidence_observations=cfg.evidence_observations,
        evidence_concurrency=cfg.evidence_concurrency,
        targets=tuple(targets),
        models=tuple(rows),
        workloads=tuple(workload_rows),
        correlations=considered,
        sequences=affinity_mod.edges(demand.affinity, now),
        predictions=seq_preds,
        ignored_requests=demand.ignored,
    )
