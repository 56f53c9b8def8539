"""Joint portfolio search: which model each active workload's `auto` demand is projected onto.

The forecast alone picks every workload's exploitation leader independently. On a scarce fleet
that can leave a workload unserved while a model that several workloads could share would
have served them all (seed: "a shared generalist can beat two slightly better specialists when
only one model slot is available"). When two or more workloads are admitted, :func:`search`
starts from those independent, evidence-backed choices and evaluates complete
workload -> model maps with the real planner: the caller's ``counterfactual(mapping)`` gives the
forecast with that mapping, its targets become the planner input's demand, and ``planner``
plans it.

Objective (compared lexicographically, larger is better; :class:`Score`):

1. ``protected``: replicas placed for baseline and direct targets (capped at their wants), so
   a portfolio never buys workload coverage with configured or directly demanded service;
2. ``coverage``: admitted workloads whose model the plan places (or, for at most one new
   preemption-only model, explicitly stages a preemption for), or that another placed model
   suits (the router's `auto` choice serves them there);
3. ``served``: workloads whose own model the plan places, so demand is not left projected
   onto a model that gets no replica while another one serves the workload;
4. ``moved``: fewer workloads whose own model the independent plan places moved to another
   model (a move drains a serving model: churn that only coverage or served workloads buy);
5. ``pressure``: the workloads' offered concurrency, times the share of their model's wanted
   replicas the plan places;
6. fewer missing replicas (planner shortfalls);
7. spare model slots: fewer distinct models placed;
8. measured utility (candidate scores without the optimism bonus) minus a bounded transition
   penalty for every chosen model with no ready replica, so a cold switch needs a meaningful
   gain and, once made, the penalty protects the new incumbent.

Search, bounded whatever the catalog: at most ``MAX_CANDIDATES`` per workload (the leader and
the broadest cross-workload model are always among them) and ``MAX_PORTFOLIOS`` planner
evaluations. A start that already places every workload fully is kept (the roomy-fleet fast
path: nothing can beat it on coverage, pressure or missing replicas, and consolidating would
only cost churn). When the candidate models outnumber the fleet's nominal model slots, a
subset search ranks admitted model sets by cheap set coverage and verifies the best few with
the planner: it crosses multi-change optima (two workloads moving onto one shared model at
once) that a one-coordinate step cannot. Then a coordinate search changes one workload at a
time, keeping strict improvements. Exploration budget: at most one unvalidated model that is
not some workload's leader may enter a portfolio; a portfolio adding more than one new
preemption-only model is refused.

Pure: explicit ``now`` (carried by the inputs), sorted iteration, no I/O, ties keep the
earlier (independent first) portfolio.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence

import msgspec

from grid.demand.forecast import WORKLOAD_ADMITTED, ModelCandidate, Forecast, WorkloadForecast
from grid.demand.outcomes import suitability_points
from grid.events.control import ModelProfile
from grid.fleet.planning import Plan, PlannerInput
from grid.fleet.views import raw_allocatable_mb
from grid.fleet.views import HostView, Value

MAX_CANDIDATES = 4
MAX_PORTFOLIOS = 64
# Subsets ranked by cheap set coverage that are verified with the planner.
SUBSET_VERIFY = 8
# Transition penalty: points per 30 s of startup for a chosen model with no ready replica,
# capped; about the size of the optimism bonus (6 points), well below a configured
# suitability difference of 0.1 (10 points).
TRANSITION_POINTS_PER_30S = 1.0
MAX_TRANSITION_POINTS = 8.0

# Why the search returned its mapping (PortfolioResult.reason).
REASON_SINGLE = "single_workload"  # fewer than two admitted workloads: nothing to search
REASON_COMPLETE = "independent_complete"  # the start places every workload fully
REASON_KEPT = "independent_best"  # searched; nothing beat the independent choices
REASON_IMPROVED = "joint_improved"  # searched; a different portfolio scored higher

Counterfactual = Callable[[Mapping[str, str]], Forecast]
PlanFn = Callable[[PlannerInput], Plan]


class Score(Value, frozen=True, kw_only=True):
    protected: int
    coverage: int
    pressure: float
    missing: int
    models: int
    utility: float
    # Workloads the independent plan serves that this portfolio moves to another model.
    moved: int = 0
    # The workloads this portfolio covers, and those whose own model it places (not part of
    # the objective's order).
    covered: tuple[str, ...] = ()
    served: tuple[str, ...] = ()

    def key(self) -> tuple[int, int, int, int, float, int, int, float]:
        return (self.protected, self.coverage, len(self.served), -self.moved, self.pressure, -self.missing,
                -self.models, self.utility)


class PortfolioResult(Value, frozen=True, kw_only=True):
    mapping: dict[str, str]
    independent: dict[str, str]
    reason: str
    evaluations: int
    score: Score | None = None
    independent_score: Score | None = None
    # The model the chosen portfolio spends the exploration budget on (None: none).
    exploring: str | None = None


def _active(fc: Forecast) -> list[WorkloadForecast]:
    return [r for r in fc.workloads if r.status == WORKLOAD_ADMITTED and r.model_id is not None]


def _utilities(
    rows: Sequence[WorkloadForecast], profiles: Mapping[str, ModelProfile],
) -> tuple[dict[str, dict[str, float]], dict[str, frozenset[str]]]:
    """Per workload: candidate -> measured utility (score without bonus), at most MAX_CANDIDATES,
    always holding the leader and the broadest cross-workload model; and the unvalidated ones."""
    names = [r.workload for r in rows]
    # Broadest: the placeable model (one some row lists) suitable for the most active workloads.
    listed = sorted({c.model_id for r in rows for c in r.candidates})
    breadth = {m: sum(1 for w in names if profiles[m].workload_scores.get(w, 0.0) > 0.0)
               for m in listed if m in profiles}
    broadest = min(breadth, key=lambda m: (-breadth[m], m)) if breadth else None
    utils: dict[str, dict[str, float]] = {}
    unvalidated: dict[str, frozenset[str]] = {}
    for r in rows:
        shown: dict[str, ModelCandidate] = {c.model_id: c for c in r.candidates}
        order: list[str] = [r.model_id]  # type: ignore[list-item]
        if broadest is not None and profiles[broadest].workload_scores.get(r.workload, 0.0) > 0.0:
            order.append(broadest)
        order.extend(c.model_id for c in r.candidates)
        picked: dict[str, float] = {}
        for m in order:
            if m in picked or len(picked) >= MAX_CANDIDATES:
                continue
            c = shown.get(m)
            # A broadest model beyond the shown candidates: its configured suitability only.
            picked[m] = (c.score - c.bonus) if c is not None else suitability_points(
                profiles[m].workload_scores.get(r.workload, 0.0))
        utils[r.workload] = picked
        unvalidated[r.workload] = frozenset(m for m, c in shown.items() if not c.validated)
    return utils, unvalidated


def nominal_slots(hosts: Sequence[HostView], memory_mb: Sequence[int]) -> int:
    """Model slots the fleet nominally offers: each host's model limit, or (unlimited) how many
    of the given model sizes, smallest first, fit its raw allocatable memory."""
    sizes = sorted(max(1, m) for m in memory_mb)
    total = 0
    for h in hosts:
        limit = int(h.resources.model_limit)
        raw = raw_allocatable_mb(h.resources)
        fit = 0
        for s in sizes:
            if s > raw:
                break
            raw -= s
            fit += 1
        total += min(limit, fit) if limit > 0 else fit
    return total


def _transition(profile: ModelProfile, ready: int) -> float:
    if ready > 0:
        return 0.0
    startup = max(0.0, float(profile.load_seconds) + float(profile.warm_seconds))
    return min(MAX_TRANSITION_POINTS, TRANSITION_POINTS_PER_30S * startup / 30.0)


def score(
    mapping: Mapping[str, str],
    fc: Forecast,
    plan: Plan,
    rows: Sequence[WorkloadForecast],
    utils: Mapping[str, Mapping[str, float]],
    profiles: Mapping[str, ModelProfile],
    ready: Mapping[str, int],
) -> tuple[Score, frozenset[str]]:
    """The objective of one evaluated portfolio, and its preemption-only models."""
    placed: dict[str, int] = {}
    for p in plan.placements:
        placed[p.model_id] = placed.get(p.model_id, 0) + 1
    staged = frozenset(p.beneficiary_model for p in plan.preemptions)
    wanted = {t.model_id: t.replicas for t in fc.targets}
    protected = sum(min(t.replicas, placed.get(t.model_id, 0)) for t in fc.targets
                    if t.evidence in ("baseline", "direct"))
    chosen = sorted(set(mapping.values()))
    preemption_only = frozenset(m for m in chosen if not placed.get(m) and m in staged)
    covered: list[str] = []
    served: list[str] = []
    pressure = 0.0
    for r in rows:
        m = mapping[r.workload]
        if placed.get(m):
            served.append(r.workload)
        # Covered: its model is placed (or staged), or another placed model suits it, which the
        # router's `auto` choice falls back to (so moving it buys no coverage).
        if placed.get(m) or m in preemption_only or any(
                profiles[p].workload_scores.get(r.workload, 0.0) > 0.0 for p in placed if p in profiles):
            covered.append(r.workload)
        if placed.get(m) and wanted.get(m):
            pressure += r.offered_concurrency * min(1.0, placed[m] / wanted[m])
    missing = sum(max(0, s.wanted - s.placed) for s in plan.shortfalls)
    utility = sum(utils[r.workload].get(mapping[r.workload], 0.0) for r in rows)
    utility -= sum(_transition(profiles[m], ready.get(m, 0)) for m in chosen if m in profiles)
    return Score(
        protected=protected, coverage=len(covered), pressure=round(pressure, 6), missing=missing,
        models=sum(1 for m in placed if placed[m] > 0), utility=round(utility, 6), covered=tuple(covered),
        served=tuple(served),
    ), preemption_only


def search(
    fc: Forecast,
    base: PlannerInput,
    counterfactual: Counterfactual,
    planner: PlanFn,
    *,
    ready: Mapping[str, int] = {},
) -> tuple[PortfolioResult, Forecast]:
    """The portfolio (workload -> model) to forecast with, and its forecast; ``fc`` is the
    independent forecast (returned unchanged when the search keeps the independent choices).

    ``base`` is the tick's planner input (its demand is replaced by each counterfactual's
    targets); ``counterfactual`` and ``planner`` must be pure.
    """
    rows = sorted(_active(fc), key=lambda r: r.workload)
    independent = {r.workload: r.model_id for r in rows}  # type: ignore[misc]
    if len(rows) < 2:
        return PortfolioResult(mapping=dict(independent), independent=independent, reason=REASON_SINGLE,
                               evaluations=0), fc
    profiles = {p.model_id: p for p in base.profiles}
    utils, unvalidated = _utilities(rows, profiles)
    leaders = frozenset(independent.values())
    evaluated: dict[tuple[tuple[str, str], ...], tuple[Score, Forecast] | None] = {}
    # The independent portfolio's own preemption-only models (None until it is evaluated).
    start_preempt: frozenset[str] | None = None

    def exploring(mapping: Mapping[str, str]) -> frozenset[str]:
        return frozenset(m for w, m in mapping.items() if m not in leaders and m in unvalidated[w])

    def evaluate(mapping: dict[str, str]) -> Score | None:
        nonlocal start_preempt
        k = tuple(sorted(mapping.items()))
        if k in evaluated:
            got = evaluated[k]
            return None if got is None else got[0]
        if len(evaluated) >= MAX_PORTFOLIOS or len(exploring(mapping)) > 1:
            return None
        cf = fc if mapping == independent else counterfactual(mapping)
        plan = planner(msgspec.structs.replace(base, demand=cf.targets))
        s, pre_only = score(mapping, cf, plan, rows, utils, profiles, ready)
        if start_score is not None:
            s = msgspec.structs.replace(s, moved=sum(1 for w in start_score.served if mapping[w] != independent[w]))
        if start_preempt is None:
            start_preempt = pre_only
        elif len(pre_only - start_preempt) > 1:
            evaluated[k] = None  # more than one new preemption-only model in one tick
            return None
        evaluated[k] = (s, cf)
        return s

    start_score: Score | None = None
    start_score = evaluate(dict(independent))
    assert start_score is not None
    best, best_score = dict(independent), start_score
    if len(start_score.served) == len(rows) and start_score.missing == 0:
        return PortfolioResult(mapping=best, independent=independent, reason=REASON_COMPLETE,
                               evaluations=len(evaluated), score=start_score, independent_score=start_score), fc

    def consider(mapping: dict[str, str]) -> bool:
        nonlocal best, best_score
        s = evaluate(mapping)
        if s is not None and s.key() > best_score.key():
            best, best_score = mapping, s
            return True
        return False

    # Subset search: the candidate models outnumber the fleet's nominal slots.
    required = frozenset(t.model_id for t in fc.targets if t.evidence in ("baseline", "direct"))
    pool = sorted({m for w in utils for m in utils[w]} - required)
    slots = nominal_slots(base.hosts, [profiles[m].memory_mb for m in sorted(required | set(pool))])
    if len(pool) + len(required) > slots:
        free = max(1, slots - len(required))
        ranked: list[tuple[tuple, dict[str, str]]] = []
        for size in range(1, min(free, len(pool)) + 1):
            for subset in itertools.combinations(pool, size):
                admitted = required | frozenset(subset)
                mapping = dict(independent)
                covered = 0
                pressure = 0.0
                utility = 0.0
                for r in rows:
                    options = [m for m in utils[r.workload] if m in admitted]
                    if options:
                        m = max(options, key=lambda m: (utils[r.workload][m], m == independent[r.workload], m))
                        mapping[r.workload] = m
                        covered += 1
                        pressure += r.offered_concurrency
                        utility += utils[r.workload][m]
                memory = sum(profiles[m].memory_mb for m in subset)
                ranked.append(((-covered, -round(pressure, 6), size, memory, -round(utility, 6), subset), mapping))
        ranked.sort(key=lambda x: x[0])
        verified = 0
        for _, mapping in ranked:
            if verified >= SUBSET_VERIFY or len(evaluated) >= MAX_PORTFOLIOS:
                break
            if tuple(sorted(mapping.items())) in evaluated:
                continue
            verified += 1
            consider(mapping)

    # Coordinate search: one workload at a time, strict improvements, until none is left.
    improved = True
    while improved and len(evaluated) < MAX_PORTFOLIOS:
        improved = False
        for r in rows:
            for m in utils[r.workload]:
                if m != best[r.workload] and consider({**best, r.workload: m}):
                    improved = True
    explore = sorted(exploring(best))
    chosen = evaluated[tuple(sorted(best.items()))]
    assert chosen is not None
    return PortfolioResult(
        mapping=best, independent=independent, reason=REASON_IMPROVED if best != independent else REASON_KEPT,
        evaluations=len(evaluated), score=best_score, independent_score=start_score,
        exploring=explore[0] if explore else None,
    ), chosen[1]


__all__ = [
    "MAX_CANDIDATES",
    "MAX_PORTFOLIOS",
    "REASON_COMPLETE",
    "REASON_IMPROVED",
    "REASON_KEPT",
    "REASON_SINGLE",
    "PortfolioResult",
    "Score",
    "nominal_slots",
    "score",
    "search",
]
