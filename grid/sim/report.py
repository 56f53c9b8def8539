"""The scenario report as text (a table) or stable JSON bytes (same seed, same bytes)."""

from __future__ import annotations

import msgspec

from grid.sim.metrics import Report

_encoder = msgspec.json.Encoder(order="deterministic")


def to_json(report: Report, extra: dict | None = None) -> bytes:
    """Deterministic JSON: sorted keys, rounded figures, no wall-clock or machine facts."""
    body = msgspec.to_builtins(report)
    if not body.get("timeline"):
        body.pop("timeline", None)
    if extra:
        body.update(extra)
    return _encoder.encode(body)


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def render(report: Report, oracle: dict | None = None) -> str:
    r = report
    lines = [
        f"scenario  {r.machines} machines x {r.models} models x {r.users} users x {r.minutes} min, "
        f"seed {r.seed}, strategy {r.strategy}",
        f"trace     {r.trace_digest[:16]}  requests {r.requests}, served {r.served_requests}",
        "",
        f"{'served demand':<26}{_pct(r.served_demand):>10}",
        f"{'least-served workload':<26}{_pct(r.least_workload_service):>10}  ({r.least_workload})",
        f"{'least-served servable':<26}{_pct(r.least_feasible_workload_service):>10}  ({r.least_feasible_workload})",
        f"{'SLO attainment':<26}{_pct(r.slo_attainment):>10}",
        f"{'churn (loads+unloads)':<26}{r.churn:>10}  loads {r.loads}, unloads {r.unloads}, drains {r.drains}"
        f" (preemption {r.preemption_drains}), flaps {r.flaps}",
        f"{'churn after first starts':<26}{r.churn_excluding_first:>10}",
        f"{'cold starts (fetches)':<26}{r.cold_starts:>10}",
        f"{'resident memory':<26}{r.memory_mean_gib:>9.1f}G  peak {r.memory_peak_gib:.1f}G, "
        f"evening {r.evening_memory_gib:.1f}G",
        f"{'artifact disk':<26}{r.disk_used_gib:>9.1f}G",
        f"{'predictive prefetch':<26}{r.prefetch_downloads:>10}  downloads ({r.prefetch_download_gib:.1f}G), "
        f"hits {r.prefetch_hits}, unused {r.prefetch_unused}, expired {r.prefetch_expired} "
        f"({r.prefetch_reclaimed_gib:.1f}G reclaimed), median lead {r.prefetch_lead_seconds:.0f}s, "
        f"avoided load {r.avoided_load_seconds:.0f}s",
        f"{'safety':<26}{r.safety_violations:>10}  violations in {r.safety_checks} checked ticks",
        "",
        f"{'workload':<12}{'requests':>9}{'served':>9}{'service':>9}{'SLO':>8}",
    ]
    for w in r.workloads:
        lines.append(f"{w.workload:<12}{w.requests:>9}{w.served_requests:>9}{_pct(w.service):>9}"
                     f"{_pct(w.slo_attainment):>8}")
    if r.shortfall_minutes:
        lines.append("")
        lines.append("planner shortfall minutes: " + ", ".join(f"{m} {n}" for m, n in r.shortfall_minutes.items()))
    if r.unserved_reasons:
        lines.append("unserved requests by reason: " + ", ".join(f"{k} {v}" for k, v in r.unserved_reasons.items()))
    if r.violations_by_invariant:
        lines.append("")
        lines.append("safety violations: " + ", ".join(f"{k} {v}" for k, v in r.violations_by_invariant.items()))
        for v in r.violation_samples:
            lines.append(f"  t+{v.minute:04d}m {v.invariant}: {v.detail}")
    if r.recommendations:
        lines.append("")
        lines.append("capacity recommendations:")
        lines.extend(f"  - {x}" for x in r.recommendations)
    if oracle is not None:
        lines.append("")
        lines.extend(render_oracle(oracle, r))
    if r.timeline:
        lines.append("")
        lines.append("timeline:")
        lines.extend(f"  {x}" for x in r.timeline)
    return "\n".join(lines)


def render_oracle(o: dict, r: Report) -> list[str]:
    if o.get("refused"):
        return [f"oracle: refused: {o['refused']}"]
    ratio = r.served_demand / o["served_demand"] if o["served_demand"] else 1.0
    return [
        f"oracle (hindsight, {o['block_minutes']}-min blocks, {o['states_evaluated']} states evaluated)",
        f"  service ceiling {_pct(o['served_demand'])}, this strategy {ratio:.3f} of it, "
        f"remaining potential gain {_pct(max(0.0, o['served_demand'] - r.served_demand))}",
        f"  least-served workload {_pct(o['least_workload_service'])} ({o['least_workload']}), "
        f"evening memory {o['evening_memory_gib']:.1f}G, placement changes {o['mutations']}",
        f"  least-served servable workload {_pct(o['least_feasible_workload_service'])} "
        f"({o['least_feasible_workload']})",
        f"  artifact disk audit: {o['disk_audit']}",
        f"  startup audit: {o['startup_audit']}",
    ]
