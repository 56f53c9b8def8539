"""Explanations: why each model is where it is, and why not elsewhere.

For every model the plan carries a ``ModelExplanation``: the statically eligible hosts, the
rejection reason per rejected host (static reasons for every model; for a model with a
shortfall also the dynamic reason each eligible host could not take one more replica), the
scores of the chosen hosts and the shortfall reason. Host lists are bounded by
``policy.explain_host_limit`` (first hosts by id) so a 4096-host plan stays small; the counts
per reason are complete. ``grid.planner.plan.explain_model`` gives the unbounded per-host
breakdown for one model.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator

from grid.fleet import reasons as R
from grid.fleet.planning import HostVerdict, ModelExplanation, Placement, Plan, Shortfall
from grid.planner.feasibility import CHAIN
from grid.planner.ledger import Ledger
from grid.planner.state import HostState, ModelState

# (counts per reason, first verdicts, first detail per reason, hosts examined)
DynamicRejections = tuple[Counter[str], list[HostVerdict], dict[str, str], int]

# Shortfall precedence for ModelExplanation.shortfall_reason.
_PRIMARY = (
    R.NO_ELIGIBLE_HOST,
    R.PIN_UNSATISFIED,
    R.PREEMPTION_STAGED,
    R.AWAITING_RELEASE,
    R.EVICTION_BUDGET,
)
_LAST = (R.FAILURE_DOMAIN, R.RETAINED_NONCOMPLIANT)


def _listed(led: Ledger, ms: ModelState) -> list[int]:
    req = ms.req
    ids: set[str] = set(req.deny) | set(req.pins)
    if req.allow is not None:
        ids |= req.allow
    if req.qualified is not None:
        ids |= req.qualified
    out = {led.fleet.by_id[h].idx for h in ids if h in led.fleet.by_id}
    out.update(ms.special)
    return sorted(out)


def static_counts(led: Ledger, ms: ModelState) -> tuple[int, Counter[str]]:
    """(eligible host count, rejected hosts per static reason), complete and exact."""
    counts: Counter[str] = Counter()
    eligible = 0
    listed = _listed(led, ms)
    per_class: dict[int, list] = {}
    for hi in listed:
        hs = led.hosts[hi]
        per_class.setdefault(hs.cls.idx, []).append(hs)
        v = led.host_static(hs, ms)
        if v is None:
            eligible += 1
        else:
            counts[v[0]] += 1
    for cls in led.classes:
        mine = per_class.get(cls.idx, ())
        n = len(cls.hosts) - len(mine)
        if n <= 0:
            continue
        if not cls.eligible:
            counts[cls.lifecycle_reason] += n
        elif ms.req.allow is not None:
            counts[R.NOT_ALLOWED] += n
        elif ms.req.pins:
            counts[R.PIN_MISMATCH] += n
        elif ms.req.qualified is not None:
            counts[R.NOT_QUALIFIED] += n
        else:
            v = led.class_verdict(cls, ms)
            if v is not None:
                counts[v[0]] += n
                continue
            mem = ms.class_mem[cls.idx][1]
            fits = len(cls.caps) - bisect_left(cls.caps, mem)
            small = len(cls.caps) - fits
            for hs in mine:
                if hs.cap_new >= mem:
                    fits -= 1
                else:
                    small -= 1
            eligible += fits
            if small:
                counts[R.INSUFFICIENT_MEMORY] += small
    return eligible, counts


def eligible_hosts(led: Ledger, ms: ModelState) -> Iterator[HostState]:
    """Statically eligible hosts in host-id order (lazy)."""
    special = ms.special_set
    if ms.explicit:
        for hi in ms.special:
            hs = led.hosts[hi]
            if led.host_static(hs, ms) is None:
                yield hs
        return
    lists = [led.classes[ci].hosts for ci in sorted(ms.class_mem)]
    lists.append(list(ms.special))
    last = -1
    deny = ms.req.deny
    for hi in heapq.merge(*lists):
        if hi == last:
            continue
        last = hi
        hs = led.hosts[hi]
        if hi in special:
            if led.host_static(hs, ms) is None:
                yield hs
        elif hs.host_id not in deny and hs.cap_new >= ms.class_mem[hs.cls.idx][1]:
            yield hs


def static_rejections(led: Ledger, ms: ModelState, limit: int) -> list[HostVerdict]:
    """The first `limit` statically rejected hosts by id, with reason and detail."""
    out: list[HostVerdict] = []
    if limit <= 0:
        return out
    if ms.explicit:
        source: Iterator[int] = iter(range(len(led.hosts)))
    else:
        lists: list = [cls.hosts for cls in led.classes if cls.idx not in ms.class_mem]
        lists.append(_listed(led, ms))
        for ci in sorted(ms.class_mem):
            cls = led.classes[ci]
            mem = ms.class_mem[ci][1]
            if cls.caps and cls.caps[0] < mem:
                lists.append(hi for hi in cls.hosts if led.hosts[hi].cap_new < mem)
        source = heapq.merge(*lists)
    last = -1
    for hi in source:
        if hi == last:
            continue
        last = hi
        hs = led.hosts[hi]
        v = led.host_static(hs, ms)
        if v is not None:
            out.append(
                HostVerdict(
                    host_id=hs.host_id, eligible=False, reason=v[0], detail=v[1]
                )
            )
            if len(out) >= limit:
                break
    return out


# Hosts examined per model for capacity reasons (a saturated 4096-host fleet would otherwise
# cost models x hosts dynamic checks just to explain what is already known to be full).
DYNAMIC_SCAN_LIMIT = 64


def dynamic_rejections(
    led: Ledger, ms: ModelState, limit: int, scan_limit: int = DYNAMIC_SCAN_LIMIT
) -> DynamicRejections:
    """Why eligible hosts (without this model) cannot take one more replica now.

    Returns (counts per reason, first `limit` verdicts, first detail per reason, hosts
    examined). The first `scan_limit` eligible hosts by id are examined."""
    counts: Counter[str] = Counter()
    sample: list[HostVerdict] = []
    first_detail: dict[str, str] = {}
    mid = ms.req.model_id
    scanned = 0
    # The next replica's tier decides the disk reserve (predictive transfers leave more free).
    extra = led.predictive_extra if ms.tier_of(ms.progress) == "inferred" else 0
    for hs in eligible_hosts(led, ms):
        if scanned >= scan_limit:
            break
        if mid in hs.desired:
            continue
        scanned += 1
        _, mem = led.runtime_for(hs.cls, ms)
        disk = led.disk_need(hs, ms)
        r = CHAIN.dynamic_check(
            hs, ms.req, mem, disk + extra if disk else 0, led.headroom
        )
        if r is None:
            if (
                ms.domain_target() > len(ms.used_domains)
                and hs.domain in ms.used_domains
            ):
                r = (R.FAILURE_DOMAIN, f"domain {hs.domain} already used")
            else:
                continue
        counts[r[0]] += 1
        first_detail.setdefault(r[0], f"{hs.host_id}: {r[1]}")
        if len(sample) < limit:
            sample.append(
                HostVerdict(host_id=hs.host_id, eligible=True, reason=r[0], detail=r[1])
            )
    return counts, sample, first_detail, scanned


def _dominant(counts: Counter[str]) -> str | None:
    if not counts:
        return None
    return min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0]


def model_shortfalls(
    led: Ledger,
    ms: ModelState,
    static: tuple[int, Counter[str]],
    dyn: DynamicRejections,
) -> list[Shortfall]:
    """Every reason this model has fewer compliant replicas than wanted (or a weaker spread)."""
    placed = len(ms.entries)
    wanted = ms.wanted
    mid = ms.req.model_id
    out: list[tuple[str, str]] = list(ms.shortfalls)
    if ms.staged:
        out.append(
            (
                R.PREEMPTION_STAGED,
                f"{ms.staged} replica(s) wait for staged drain on "
                + ",".join(ms.staged_hosts),
            )
        )
    if ms.awaiting:
        out.append(
            (
                R.AWAITING_RELEASE,
                f"{ms.awaiting} replica(s) wait for leaving residencies on "
                + ",".join(ms.staged_hosts),
            )
        )
    if ms.relocating:
        out.append(
            (
                R.RELOCATION_STAGED,
                f"{ms.relocating} replica(s) wait for another model to move off "
                + ",".join(ms.staged_hosts),
            )
        )
    pins_missing = sum(1 for r, _ in ms.shortfalls if r == R.PIN_UNSATISFIED)
    missing = wanted - placed - ms.staged - ms.awaiting - ms.relocating - pins_missing
    if missing > 0:
        eligible, counts = static
        if eligible == 0:
            top = ", ".join(
                f"{k} x{v}"
                for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
            )
            out.append((R.NO_ELIGIBLE_HOST, top))
        elif ms.placement_budget:
            out.append(
                (
                    R.PLACEMENT_BUDGET,
                    f"{led.policy.max_new_placements} new placements per plan",
                )
            )
        elif ms.budget_blocked and led.evictions >= led.policy.max_evictions:
            out.append(
                (
                    R.EVICTION_BUDGET,
                    f"{led.policy.max_evictions} evictions already staged",
                )
            )
        else:
            dcounts, _, first, _ = dyn
            reason = _dominant(dcounts) or R.NOT_PLACED
            detail = f"{missing} replica(s) unplaced; " + ", ".join(
                f"{k} x{v}"
                for k, v in sorted(dcounts.items(), key=lambda kv: (-kv[1], kv[0]))
            )
            if reason in first:
                detail += f" (e.g. {first[reason]})"
            out.append((reason, detail))
    target = ms.domain_target()
    domains = {led.hosts[e.hidx].domain for e in ms.entries}
    if len(domains) < min(target, placed):
        feasible = len(ms.used_domains) + len(
            led.eligible_domains(ms, target, exclude=ms.used_domains)
        )
        out.append(
            (
                R.FAILURE_DOMAIN,
                f"{len(domains)} of {target} failure domains ({feasible} feasible)",
            )
        )
    if ms.retained and placed < wanted:
        hosts = ", ".join(
            f"{led.hosts[m.hidx].host_id} ({m.reason})" for m in ms.retained
        )
        out.append((R.RETAINED_NONCOMPLIANT, f"kept until replaced: {hosts}"))
    seen: set[tuple[str, str]] = set()
    result = []
    for reason, detail in out:
        if (reason, detail) in seen:
            continue
        seen.add((reason, detail))
        result.append(
            Shortfall(
                model_id=mid, wanted=wanted, placed=placed, reason=reason, detail=detail
            )
        )
    result.sort(key=lambda s: (s.reason, s.detail))
    return result


def primary_reason(shortfalls: list[Shortfall]) -> str:
    if not shortfalls:
        return ""
    reasons = [s.reason for s in shortfalls]
    for r in _PRIMARY:
        if r in reasons:
            return r
    rest = [r for r in reasons if r not in _LAST]
    if rest:
        return rest[0]
    for r in _LAST:
        if r in reasons:
            return r
    return reasons[0]


def model_explanation(
    led: Ledger, ms: ModelState, chosen: tuple[Placement, ...], limit: int
) -> tuple[ModelExplanation, list[Shortfall]]:
    static = static_counts(led, ms)
    eligible_n, counts = static
    wants_more = ms.wanted > len(ms.entries)
    dyn = (
        dynamic_rejections(led, ms, limit, max(DYNAMIC_SCAN_LIMIT, limit))
        if wants_more and eligible_n > 0
        else (Counter(), [], {}, 0)
    )
    shortfalls = model_shortfalls(led, ms, static, dyn)
    rejected = list(dyn[1])
    if len(rejected) < limit:
        rejected.extend(static_rejections(led, ms, limit - len(rejected)))
    elig: list[str] = []
    if limit > 0:
        for hs in eligible_hosts(led, ms):
            elig.append(hs.host_id)
            if len(elig) >= limit:
                break
    notes = []
    if ms.retired:
        notes.append("retired")
    if dyn[3] and dyn[3] < eligible_n - len(ms.entries):
        notes.append(f"capacity reasons from the first {dyn[3]} eligible hosts")
    detail = "; ".join(notes)
    ex = ModelExplanation(
        model_id=ms.req.model_id,
        wanted=ms.wanted,
        evidence=ms.evidence_label,
        eligible_hosts=tuple(elig),
        rejected=tuple(rejected),
        chosen=chosen,
        shortfall_reason=primary_reason(shortfalls),
        priority=ms.priority,
        placed=len(ms.entries),
        eligible_count=eligible_n,
        rejected_counts=dict(sorted(counts.items())),
        capacity_counts=dict(sorted(dyn[0].items())),
        detail=detail,
    )
    return ex, shortfalls


def _fmt_scores(p: Placement) -> str:
    parts = [
        f"{k}={v:g}"
        for k, v in sorted(p.scores.items(), key=lambda kv: (-abs(kv[1]), kv[0]))
    ]
    return " ".join(parts)


def render_explanation(plan: Plan) -> list[str]:
    """Human-readable lines for `gridctl status`."""
    lines: list[str] = []
    for ex in plan.explanations:
        head = f"{ex.model_id} [priority {ex.priority}, {ex.evidence or 'none'}] {ex.placed}/{ex.wanted} placed"
        if ex.detail:
            head += f" ({ex.detail})"
        lines.append(head)
        for p in ex.chosen:
            tag = p.reason or p.status
            lines.append(
                f"  {p.host_id}: {p.status} {tag} score {p.score:g} ({_fmt_scores(p)})"
            )
        total = ex.eligible_count + sum(ex.rejected_counts.values())
        lines.append(
            f"  eligible {ex.eligible_count}/{total} hosts"
            + (
                (
                    ": "
                    + ", ".join(ex.eligible_hosts)
                    + (" ..." if ex.eligible_count > len(ex.eligible_hosts) else "")
                )
                if ex.eligible_hosts
                else ""
            )
        )
        if ex.rejected_counts:
            lines.append(
                "  rejected: "
                + ", ".join(
                    f"{k} x{v}"
                    for k, v in sorted(
                        ex.rejected_counts.items(), key=lambda kv: (-kv[1], kv[0])
                    )
                )
            )
        if ex.capacity_counts:
            lines.append(
                "  full now: "
                + ", ".join(
                    f"{k} x{v}"
                    for k, v in sorted(
                        ex.capacity_counts.items(), key=lambda kv: (-kv[1], kv[0])
                    )
                )
            )
        if ex.shortfall_reason:
            lines.append(f"  shortfall: {ex.shortfall_reason}")
    for s in plan.shortfalls:
        lines.append(
            f"shortfall {s.model_id}: {s.reason} ({s.placed}/{s.wanted}) {s.detail}".rstrip()
        )
    for pe in plan.preemptions:
        who = f" for {pe.beneficiary_model}" if pe.beneficiary_model else ""
        when = f" not before {pe.not_before:g}" if pe.not_before is not None else ""
        lines.append(
            f"preempt {pe.victim_model} on {pe.host_id}{who}: {pe.reason} ({pe.memory_mb} MB){when}"
        )
    for a in plan.prefetch:
        lines.append(
            f"prefetch {a.model_id} on {a.host_id}: {a.reason} (cache only, no slot; "
            f"{a.size_bytes >> 20} MB, value {a.value_per_mb:g}/MB = concurrency {a.concurrency:g}"
            f" x load {a.load_seconds:g}s; {a.disk_free_after_bytes >> 20} MB free after)"
        )
    for ev in plan.evictions:
        lines.append(
            f"evict {ev.model_id} on {ev.host_id}: {ev.reason} (sha {ev.artifact_sha256[:12]}, "
            f"{ev.size_bytes >> 20} MB, unused {ev.age_seconds:g}s)"
        )
    return lines
