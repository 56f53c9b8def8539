"""Compare a recorded plan with a re-run: which placements, preemptions and shortfalls differ.

Items are matched by identity (placement: model+host; preemption: host+victim+beneficiary;
shortfall: model). A difference is ``added`` (only the re-run has it), ``removed`` (only the
recording has it) or ``changed`` (both have it, a decision field differs). Scores and free-text
reasons alone are not decisions: two plans that differ only there are "equivalent".

Each difference carries the explanation of each side for the model concerned (wanted/placed,
evidence, chosen hosts, why the host was rejected, the shortfall reason), so a reader sees why
the two planners decided differently without opening the plans.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import msgspec

from grid.fleet.planning import ModelExplanation, Plan

Kind = Literal["placement", "preemption", "shortfall"]
Change = Literal["added", "removed", "changed"]

# Fields compared for each kind (the rest, such as scores, are informational).
PLACEMENT_FIELDS: tuple[str, ...] = ("runtime", "memory_mb", "status", "managed")
PREEMPTION_FIELDS: tuple[str, ...] = ("reason", "memory_mb", "not_before")
SHORTFALL_FIELDS: tuple[str, ...] = ("wanted", "placed", "reason")


class Difference(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    key: str
    change: str
    model_id: str
    host_id: str | None = None
    # The item on each side (None where absent), as plain data.
    recorded: dict[str, Any] | None = None
    replayed: dict[str, Any] | None = None
    # Fields that differ (changed only).
    fields: tuple[str, ...] = ()
    recorded_explanation: str = ""
    replayed_explanation: str = ""


def _as_dict(item: Any) -> dict[str, Any]:
    return msgspec.to_builtins(item)  # type: ignore[no-any-return]


def _keyed(items: Iterable[Any], key_fn: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        base = key_fn(item)
        key = base
        n = 2
        while key in out:  # the same identity twice (e.g. two replicas on one host)
            key = f"{base}#{n}"
            n += 1
        out[key] = item
    return out


def _placement_key(p: Any) -> str:
    return f"{p.model_id}@{p.host_id}"


def _preemption_key(p: Any) -> str:
    return f"{p.victim_model}@{p.host_id}->{p.beneficiary_model}"


def _shortfall_key(s: Any) -> str:
    return str(s.model_id)


def _explanations(plan: Plan) -> dict[str, ModelExplanation]:
    return {e.model_id: e for e in plan.explanations}


def explain(plan: Plan, model_id: str, host_id: str | None = None, item: Any = None,
            index: dict[str, ModelExplanation] | None = None) -> str:
    """One line: why this side's plan did what it did for `model_id` (and `host_id`)."""
    parts: list[str] = []
    if item is not None:
        reason = getattr(item, "reason", "")
        if reason:
            parts.append(f"reason {reason}")
        score = getattr(item, "score", None)
        if score:
            parts.append(f"score {score:.2f}")
    exp = (index if index is not None else _explanations(plan)).get(model_id)
    if exp is None:
        parts.append("no explanation recorded for this model")
        return "; ".join(parts)
    placed = getattr(exp, "placed", 0) or len(exp.chosen)
    head = f"wanted {exp.wanted}, placed {placed}"
    if exp.evidence:
        head += f" ({exp.evidence} evidence)"
    parts.append(head)
    chosen = sorted({c.host_id for c in exp.chosen})
    if chosen:
        parts.append("chosen " + ",".join(chosen[:8]) + ("…" if len(chosen) > 8 else ""))
    if host_id is not None:
        verdict = next((v for v in exp.rejected if v.host_id == host_id), None)
        if verdict is not None:
            text = f"{host_id} rejected: {verdict.reason}"
            if verdict.detail:
                text += f" ({verdict.detail})"
            parts.append(text)
        elif host_id in exp.eligible_hosts and host_id not in chosen:
            parts.append(f"{host_id} eligible, not chosen")
    counts = getattr(exp, "rejected_counts", {}) or {}
    if counts and host_id is None:
        parts.append("rejections " + ",".join(f"{k}={v}" for k, v in sorted(counts.items())))
    if exp.shortfall_reason:
        parts.append(f"shortfall {exp.shortfall_reason}")
    return "; ".join(parts)


def _compare(kind: str, fields: tuple[str, ...], recorded: dict[str, Any], replayed: dict[str, Any],
             rec_plan: Plan, rep_plan: Plan, host_of: Any) -> list[Difference]:
    out: list[Difference] = []
    rec_index, rep_index = _explanations(rec_plan), _explanations(rep_plan)
    for key in sorted(set(recorded) | set(replayed)):
        a, b = recorded.get(key), replayed.get(key)
        item = a if a is not None else b
        model_id = item.model_id if kind != "preemption" else item.beneficiary_model
        host_id = host_of(item)
        if a is not None and b is not None:
            changed = tuple(f for f in fields if getattr(a, f, None) != getattr(b, f, None))
            if not changed:
                continue
            change = "changed"
        else:
            changed = ()
            change = "removed" if b is None else "added"
        out.append(Difference(
            kind=kind, key=key, change=change, model_id=model_id, host_id=host_id,
            recorded=None if a is None else _as_dict(a),
            replayed=None if b is None else _as_dict(b),
            fields=changed,
            recorded_explanation=explain(rec_plan, model_id, host_id, a, rec_index),
            replayed_explanation=explain(rep_plan, model_id, host_id, b, rep_index),
        ))
    return out


def diff_plans(recorded: Plan, replayed: Plan) -> list[Difference]:
    """Every decision difference between two plans, placements then preemptions then shortfalls."""
    return (
        _compare("placement", PLACEMENT_FIELDS, _keyed(recorded.placements, _placement_key),
                 _keyed(replayed.placements, _placement_key), recorded, replayed, lambda p: p.host_id)
        + _compare("preemption", PREEMPTION_FIELDS, _keyed(recorded.preemptions, _preemption_key),
                   _keyed(replayed.preemptions, _preemption_key), recorded, replayed, lambda p: p.host_id)
        + _compare("shortfall", SHORTFALL_FIELDS, _keyed(recorded.shortfalls, _shortfall_key),
                   _keyed(replayed.shortfalls, _shortfall_key), recorded, replayed, lambda s: None)
    )


def describe(d: Difference) -> str:
    """A short human description of one difference."""
    if d.change == "changed":
        rec, rep = d.recorded or {}, d.replayed or {}
        return ", ".join(f"{f} {rec.get(f)!r} -> {rep.get(f)!r}" for f in d.fields)
    side = "only in re-run" if d.change == "added" else "only in recording"
    return side
