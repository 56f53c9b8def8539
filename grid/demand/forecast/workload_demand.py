"""Workload demand: automatic traffic per workload, projected onto one model.

Each workload's series is projected onto its exploitation leader: the configured model (among
those some host could hold, when the caller passes ``placeable``) with the best workload score
adjusted by measured outcomes (:mod:`grid.demand.outcomes`), a ready model winning exact ties.
When the optimism bonus ranks a different, less proven model first, that model is an
exploration option; the forecast spends at most one exploration canary (one replica,
``explore:<workload>``) on the workload with the most projected concurrency.

Admission needs three observations in the gate window, or >= 1.5 offered-concurrency units;
crossing only the concurrency gate, without a fresh validated success of that
model/workload/artifact and without direct demand, is weak evidence capped at a one-replica
canary. An affinity-sequence prediction alone admits a workload too (no concurrency). The
workload queue is not added to the model's projected concurrency (it has not been served by
that model).

With two or more active workloads the tick passes ``portfolio``, the joint search's
workload -> model map (:mod:`grid.demand.portfolio`); a mapped workload is projected onto that
candidate instead of its leader (rows: ``independent_model_id``, ``joint``) and adds no
exploration canary of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from grid.demand import outcomes as outcomes_mod
from grid.demand.affinity import SequencePrediction
from grid.demand.fold import DemandState, Series
from grid.demand.forecast.reasons import (
    GATE_CONCURRENCY,
    GATE_OBSERVATIONS,
    GATE_SEQUENCE,
    REASON_SEQUENCE,
    WORKLOAD_ADMITTED,
    WORKLOAD_BELOW_GATE,
    WORKLOAD_IDLE,
    WORKLOAD_NO_CANDIDATE,
)
from grid.demand.forecast.series import finite, series_stats
from grid.demand.forecast.sizing import replica_capacity, replicas_for
from grid.demand.forecast.types import ModelCandidate, ForecastConfig, WorkloadForecast
from grid.events.control import ModelProfile


MAX_CANDIDATES_SHOWN = 4


class WorkloadClaim(msgspec.Struct, kw_only=True):
    offered: float = 0.0
    canary: bool = True
    workloads: list[str] = []
    sequence_reasons: list[str] = []
    explore: list[str] = []


def workload_demand(
    demand: DemandState,
    live: Sequence[ModelProfile],
    by_id: Mapping[str, ModelProfile],
    starts: Mapping[str, float],
    seq_preds: Sequence[SequencePrediction],
    now: float,
    ready_replicas: Mapping[str, int],
    cfg: ForecastConfig,
    portfolio: Mapping[str, str],
) -> tuple[dict[str, WorkloadClaim], list[WorkloadForecast]]:
    """Automatic traffic per workload, projected onto its exploitation leader (the claims)."""
    claims: dict[str, WorkloadClaim] = {}
    explore_options: list[tuple[float, int, str, str]] = []
    rows: list[WorkloadForecast] = []
    pred_by_target: dict[str, SequencePrediction] = {}
    for pr in seq_preds:
        old = pred_by_target.get(pr.target)
        if old is None or (pr.expected, pr.confidence) > (old.expected, old.confidence):
            pred_by_target[pr.target] = pr
    for w in demand.vocabulary:
        series = demand.workloads.get(w)
        pred = pred_by_target.get(w)
        if series is None and pred is None:
            continue
        row, projected = workload_row(w, series, pred, demand, live, by_id, starts, now, ready_replicas, cfg,
                                      portfolio.get(w))
        if row.status == WORKLOAD_ADMITTED:
            claim = claim_for(claims, row.model_id)  # type: ignore[arg-type]
            claim.offered += projected
            claim.canary = claim.canary and row.canary
            claim.workloads.append(w)
            if row.gate == GATE_SEQUENCE and pred is not None:
                claim.sequence_reasons.append(f"{REASON_SEQUENCE}:{pred.source}->{pred.target}@{pred.confidence:.2f}")
            if row.explore_model_id is not None:
                explore_options.append((projected, len(rows), w, row.explore_model_id))
        rows.append(row)

    # Exploration budget: at most one uncertain model differs from the exploitation choice,
    # for the workload with the most projected concurrency (vocabulary order breaks ties).
    if explore_options:
        _, index, w, model_id = min(explore_options, key=lambda o: (-o[0], o[1]))
        rows[index] = msgspec.structs.replace(rows[index], exploring=True)
        claim_for(claims, model_id).explore.append(w)
    return claims, rows


def claim_for(claims: dict[str, WorkloadClaim], model_id: str) -> WorkloadClaim:
    claim = claims.get(model_id)
    if claim is None:
        claim = claims[model_id] = WorkloadClaim(workloads=[], sequence_reasons=[])
    return claim


def workload_row(
    w: str,
    series: Series | None,
    pred: SequencePrediction | None,
    demand: DemandState,
    live: Sequence[ModelProfile],
    by_id: Mapping[str, ModelProfile],
    starts: Mapping[str, float],
    now: float,
    ready_replicas: Mapping[str, int],
    cfg: ForecastConfig,
    chosen: str | None = None,
) -> tuple[WorkloadForecast, float]:
    """One workload's row and the concurrency it projects onto its leader (0 unless admitted)."""
    ranked = rank_candidates(demand, w, live, now, ready_replicas)
    # Exploitation leader: measured score without the optimism bonus. The bonus-ranked
    # leader, when different, is only an exploration option (one canary per forecast).
    best = min(ranked, key=exploit_key) if ranked else None
    explore = ranked[0] if ranked and ranked[0][0].model_id != best[0].model_id else None  # type: ignore[index]
    independent = best[0].model_id if best is not None else None
    if chosen is not None and chosen != independent and any(c.model_id == chosen for c, _ in ranked):
        # The joint portfolio search's choice replaces the leader; the search spent this
        # workload's exploration budget, so no extra canary is added for it.
        best = next(cv for cv in ranked if cv[0].model_id == chosen)
        explore = None
    leader = by_id[best[0].model_id] if best is not None else None
    prior = finite(leader.expected_service_seconds, 2.0) if leader is not None else 0.0
    st = series_stats(series, demand, now, prior, starts[leader.model_id] if leader is not None else 0.0, cfg,
                      fast_up=leader is not None and ready_replicas.get(leader.model_id, 0) > 0)
    row = dict(
        workload=w, observations=st.observations, observed_rate=st.observed, rate=st.rate,
        trend=st.slope, service_seconds=st.service, offered_concurrency=st.offered,
        projected_concurrency=st.rate * st.service, queue=st.queue, errors=st.errors,
        p95_ms=st.p95_ms, candidates=tuple(c for c, _ in ranked[:MAX_CANDIDATES_SHOWN]),
        independent_model_id=independent, joint=best is not None and best[0].model_id != independent,
    )
    gate = ""
    if st.observations >= cfg.evidence_observations and (st.offered >= cfg.min_offered or st.recent > 0):
        gate = GATE_OBSERVATIONS
    elif st.offered >= cfg.evidence_concurrency:
        gate = GATE_CONCURRENCY
    elif pred is not None:
        gate = GATE_SEQUENCE
    if not gate:
        return WorkloadForecast(status=WORKLOAD_BELOW_GATE if st.requests else WORKLOAD_IDLE, **row), 0.0
    if best is None or leader is None:
        return WorkloadForecast(status=WORKLOAD_NO_CANDIDATE, gate=gate, **row), 0.0
    cand, view = best
    projected = st.rate * st.service if gate != GATE_SEQUENCE else 0.0
    canary = gate != GATE_OBSERVATIONS and not view.validated
    replicas = 1 if canary else max(1, replicas_for(projected, replica_capacity(leader), cfg))
    sequenced = pred is not None and gate == GATE_SEQUENCE
    return WorkloadForecast(
        status=WORKLOAD_ADMITTED, gate=gate, model_id=cand.model_id, replicas=replicas, canary=canary,
        explore_model_id=explore[0].model_id if explore is not None else None,
        sequence_source=pred.source if sequenced else None,  # type: ignore[union-attr]
        sequence_confidence=pred.confidence if sequenced else 0.0,  # type: ignore[union-attr]
        **row,
    ), projected


def exploit_key(cv: tuple[ModelCandidate, outcomes_mod.OutcomeView]) -> tuple[float, int, str]:
    c = cv[0]
    return (-(c.score - c.bonus), -(c.ready > 0), c.model_id)


def rank_candidates(
    demand: DemandState,
    workload: str,
    profiles: Sequence[ModelProfile],
    now: float,
    ready: Mapping[str, int],
) -> list[tuple[ModelCandidate, outcomes_mod.OutcomeView]]:
    out = []
    for p in profiles:
        suit = outcomes_mod.suitability_points(p.workload_scores.get(workload, 0.0))
        if suit <= 0.0 or max(p.max_replicas, p.min_replicas) <= 0:
            continue
        view = outcomes_mod.view(demand.outcomes, p.model_id, workload, p.artifact_sha256, now)
        slo = p.latency_slo_ms / 1000.0 if p.latency_slo_ms else None
        score = outcomes_mod.candidate_score(suit, view, slo_seconds=slo)
        out.append((ModelCandidate(
            model_id=p.model_id, suitability=suit, score=score, confidence=view.confidence,
            quality_confidence=view.quality_confidence, samples=view.samples,
            quality_samples=view.quality_samples, bonus=view.bonus, validated=view.validated,
            ready=max(0, int(ready.get(p.model_id, 0))),
            service_age_seconds=view.service_age_seconds, quality_age_seconds=view.quality_age_seconds,
        ), view))
    # Best score first; a ready candidate wins an exact tie; model id is the final tie-break.
    out.sort(key=lambda cv: (-cv[0].score, -(cv[0].ready > 0), cv[0].model_id))
    return out
