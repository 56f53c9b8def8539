"""The pure planner entry point: ``plan(PlannerInput) -> Plan``.

Same input bytes give the same plan bytes. The plan carries ``inputs_digest`` (sha256 hex of
``grid.events.codec.encode_value(input)``) and ``planner_version`` so a replay can re-run it.

``Plan.placements`` is the complete desired set: a managed residency that is not listed is
obsolete. Entries with ``status="existing"`` are live residencies the plan keeps (incumbents,
external or operator-pinned residencies that satisfy demand with ``managed=False`` or
reason PINNED_RESIDENCY, and must-move replicas retained until their replacements are ready
with reason RETAINED_UNTIL_REPLACED); ``status="new"`` entries are replicas to load and warm.
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET

from grid.fleet import reasons as R
from grid.gcpause import collector_paused
from grid.fleet.planning import ModelBasis, ModelExplanation, Placement, Plan, PlannerInput
from grid.planner import scorers
from grid.planner.digest import inputs_digest
from grid.planner.explain import model_explanation, render_explanation
from grid.planner.ledger import Ledger
from grid.planner.placement import Placer
from grid.planner.prefetch import advisories, expiries
from grid.planner.state import HostState, ModelState

# 1.3.0: plans carry the per-model basis the reconciler decides from, and never stage a preemption
# of a model's only ready replica while that model itself wants more replicas than it has ready.
# 1.4.0: hosts carry their runtime qualifications and a profile may require one (no decision
# changes for profiles that do not); every input digest changes with the new fields.
# 1.5.0: flap quarantine (hosts and models whose lifecycle flaps take no new placement for a
# backoff, never at the cost of a replica); every input digest changes with the new field.
# 1.5.1: a short model's other ready copy counts as a survivor only when it keeps serving (on an
# eligible host, not a victim of the same plan).
# 1.6.0: the input carries the open load/warm commands (pending placements), and a still-feasible
# pending placement scores above an equal alternative (every input digest changes).
# 1.7.0: predictive cache: cache-only advisories for correlation-only predictions without a
# serving slot, and expiry of unused predictive downloads (new plan and policy fields).
# 1.8.0: a kept incumbent is charged what its profile declares now in the desired ledger (the
# declaration it loaded with still counts as live memory); a lowered declaration no longer
# moves copies off a host that can hold them.
PLANNER_VERSION = "grid-planner/1.8.0"

__all__ = [
    "PLANNER_VERSION",
    "build_plan",
    "explain_model",
    "plan",
    "render_explanation",
]

def plan(inp: PlannerInput) -> Plan:
    """Compute the complete desired placement, staged preemptions, shortfalls, explanations
    (presentation) and each model's basis (what the reconciler decides from)."""
    return build_plan(inp)


def build_plan(inp: PlannerInput, *, reference_scan: bool = False) -> Plan:
    """``plan`` with a switch for the reference full-scan candidate search (tests and the
    planner benchmark: both searches must give byte-identical plans).

    Flap quarantine of hosts is a preference, never a cost: when the plan that holds the
    quarantined hosts out of new placement keeps fewer replicas of some model than the plan
    that does not (the quarantined host was the only room left, or the room elsewhere went to
    another model first), the plan without host quarantine is the plan. Model quarantine stays
    in both (it already gives a model with no replica its one)."""
    # The cyclic collector is paused while a plan is built (grid.gcpause: a quarter of a
    # 10,000-host plan's CPU went to traversals that freed nothing).
    with collector_paused():
        digest = inputs_digest(inp)
        held = _build(inp, digest, reference_scan)
        if not any(q.kind == "host" for q in inp.flap_quarantines):
            return held
        models_only = tuple(q for q in inp.flap_quarantines if q.kind != "host")
        free = _build(msgspec.structs.replace(inp, flap_quarantines=models_only), digest, reference_scan)
        return held if _keeps_as_many(held, free) else free


def _replicas(p: Plan) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in p.placements:
        out[x.model_id] = out.get(x.model_id, 0) + 1
    return out


def _keeps_as_many(held: Plan, free: Plan) -> bool:
    """Every model has at least as many replicas in `held` as in `free`."""
    mine = _replicas(held)
    return all(mine.get(m, 0) >= n for m, n in _replicas(free).items())


def _build(inp: PlannerInput, digest: str, reference_scan: bool) -> Plan:
    placer = Placer(inp, reference_scan=reference_scan)
    placer.run()
    led = placer.ledger
    limit = max(0, int(inp.policy.explain_host_limit))
    placements: list[Placement] = []
    shortfalls = []
    explanations = []
    basis = []
    holders = _managed_holders(inp)
    for ms in led.models:
        mine: list[Placement] = []
        for e in ms.entries:
            hs = led.hosts[e.hidx]
            mine.append(
                Placement(
                    model_id=ms.req.model_id,
                    host_id=hs.host_id,
                    runtime=e.slot.runtime,
                    memory_mb=e.slot.memory_mb,
                    status=e.status,
                    score=e.score,
                    scores=scorers.as_dict(e.values),
                    reason=e.reason,
                    managed=e.managed,
                    devices=e.slot.devices or UNSET,
                )
            )
        for mm in ms.retained:
            hs = led.hosts[mm.hidx]
            r = mm.residency
            mem = max(0, int(r.memory_mb))
            values = led.host_values(hs, ms, mem, incumbent=r)
            mine.append(
                Placement(
                    model_id=ms.req.model_id,
                    host_id=hs.host_id,
                    runtime=r.runtime,
                    memory_mb=mem,
                    status="existing",
                    score=scorers.combine(values, ms.boost),
                    scores=scorers.as_dict(values),
                    reason=R.RETAINED_UNTIL_REPLACED,
                    managed=True,
                )
            )
        mine.sort(key=lambda p: p.host_id)
        ex, sf = model_explanation(led, ms, tuple(mine), limit)
        placements.extend(mine)
        shortfalls.extend(sf)
        explanations.append(ex)
        basis.append(_model_basis(led, ms, holders.get(ms.req.model_id, ())))
    preemptions = sorted(
        led.preemptions, key=lambda p: (p.host_id, p.victim_model, p.beneficiary_model)
    )
    # Last: speculative transfers see the disk every demanded placement already took.
    prefetch = advisories(led)
    return Plan(
        planner_version=PLANNER_VERSION,
        inputs_digest=digest,
        now=float(inp.now),
        placements=tuple(placements),
        preemptions=tuple(preemptions),
        shortfalls=tuple(shortfalls),
        explanations=tuple(explanations),
        basis=tuple(basis),
        prefetch=prefetch,
        evictions=expiries(led, prefetch),
    )


def _managed_holders(inp: PlannerInput) -> dict[str, tuple[str, ...]]:
    """Model id -> hosts holding a managed (Grid-owned, unpinned) copy of it, by host id."""
    out: dict[str, set[str]] = {}
    for h in inp.hosts:
        for r in h.residencies:
            if r.managed and not r.pinned:
                out.setdefault(r.model_id, set()).add(h.host_id)
    return {m: tuple(sorted(ids)) for m, ids in out.items()}


def _statically_eligible(led: Ledger, ms: ModelState, hs: HostState) -> bool:
    """Membership in ``explain.eligible_hosts(led, ms)``, decided for one host."""
    if ms.explicit or hs.idx in ms.special_set:
        return hs.idx in ms.special_set and led.host_static(hs, ms) is None
    mem = ms.class_mem.get(hs.cls.idx)
    return mem is not None and hs.host_id not in ms.req.deny and hs.cap_new >= mem[1]


def _model_basis(led: Ledger, ms: ModelState, holders: tuple[str, ...]) -> ModelBasis:
    by_id = led.fleet.by_id
    return ModelBasis(
        model_id=ms.req.model_id,
        evidence=ms.evidence_label,
        eligible_holders=tuple(
            h for h in holders if (hs := by_id.get(h)) is not None and _statically_eligible(led, ms, hs)
        ),
    )


def explain_model(inp: PlannerInput, model_id: str) -> ModelExplanation | None:
    """The unbounded explanation of one model (every host listed), computed on demand."""
    full = msgspec.structs.replace(inp.policy, explain_host_limit=1 << 30)
    p = plan(msgspec.structs.replace(inp, policy=full))
    for ex in p.explanations:
        if ex.model_id == model_id:
            return ex
    return None
