"""Flap quarantine (pure): which hosts and models are held out of new placement at `now`.

A host whose lifecycle flaps (it goes silent and comes back, or its state changes, again and
again) or a model whose residencies keep failing attracts new replicas that are lost soon after:
every return looks like free capacity, so the planner fills it, and the next flap takes that
work away again. Flap quarantine holds such a subject out of NEW placement for a backoff; what it
already runs stays (the planner keeps incumbents, so a model's only ready replica is never
taken away by a quarantine), and the release is automatic. It never costs service: a held model
with no replica still gets one, and a plan that holding hosts out would cost a replica of any
model is made without host quarantine (grid.planner.plan.build_plan).

The rule, over one subject's transition times (oldest first, as the lifecycle projection
records them from the log):

* at a transition at time t that is not inside an earlier quarantine, count the transitions in
  (t - window, t]; with at least `threshold` of them the subject is quarantined from t;
* the backoff is `base * 2**level`, capped at `cap`; the level is one more than the previous
  quarantine's when this one begins within `cap` of that one's release, else 0;
* at `now` a subject is quarantined when its last quarantine began at or before `now` and ends
  after it.

Only transitions inside the lookback `(now - lookback(...), now]` count. The answer is then a
function of the last few hours of the log and `now` alone, never of where a fold of the log
began: a controller that has followed the log since before its retention trimmed the stream, a
replay of what the stream still holds, and a replay of an export window that starts a lookback
or more before a plan all rebuild the same quarantines. (Counting every transition since the
fold began, the answer depended on that start, and on which old transitions a count cap had
pushed out: two folds of the same recent log could disagree.) The lifecycle projection keeps at
least `HISTORY_SECONDS` of transitions, the longest lookback a policy can ask for.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence

from grid.fleet import reasons as R
from grid.fleet.planning import FlapQuarantine, FlapQuarantineKind, Policy

# The longest lookback the rule uses, whatever the policy (the lifecycle projection keeps this
# much history): twelve hours, well beyond the defaults' 4.5.
HISTORY_SECONDS = 12 * 3600.0


def lookback(*, window: float, base: float, cap: float) -> float:
    """How far before `now` transitions count: the window that starts a quarantine plus two of
    the longest backoffs (enough for the backoff to double up to its cap), at most
    HISTORY_SECONDS."""
    return min(HISTORY_SECONDS, max(0.0, window) + 2 * max(cap, base, 0.0))


def episodes(
    times: Sequence[float], *, window: float, threshold: int, base: float, cap: float
) -> list[tuple[float, float, int, int]]:
    """Every quarantine the transition times give: (since, until, level, transitions)."""
    if threshold <= 0 or window <= 0 or base <= 0:
        return []
    ordered = sorted(times)
    out: list[tuple[float, float, int, int]] = []
    for i, t in enumerate(ordered):
        if out and t < out[-1][1]:
            continue  # already held: a flap during the backoff does not start another
        first = bisect_right(ordered, t - window, 0, i + 1)
        count = i + 1 - first
        if count < threshold:
            continue
        level = out[-1][2] + 1 if out and t - out[-1][1] <= cap else 0
        backoff = min(base * (2.0 ** min(level, 62)), max(cap, base))
        out.append((t, t + backoff, level, count))
    return out


def active(
    kind: FlapQuarantineKind, subject: str, times: Sequence[float], now: float, *, window: float, threshold: int,
    base: float, cap: float,
) -> FlapQuarantine | None:
    """The quarantine in force for one subject at `now`, or None."""
    start = now - lookback(window=window, base=base, cap=cap)
    seen = [t for t in times if start < t <= now]
    eps = episodes(seen, window=window, threshold=threshold, base=base, cap=cap)
    if not eps:
        return None
    since, until, level, count = eps[-1]
    if not since <= now < until:
        return None
    return FlapQuarantine(kind=kind, subject=subject, reason=R.FLAP_QUARANTINE, since=since, until=until,
                      transitions=count, level=level)


def quarantines(
    host_transitions: Mapping[str, Sequence[float]],
    model_transitions: Mapping[str, Sequence[float]],
    now: float,
    policy: Policy,
) -> tuple[FlapQuarantine, ...]:
    """Hosts and models quarantined at `now`, hosts first, each by subject id."""
    out: list[FlapQuarantine] = []
    window = policy.flap_window_seconds
    base, cap = policy.flap_backoff_seconds, policy.flap_backoff_max_seconds
    for kind, tracks, threshold in (("host", host_transitions, policy.flap_host_transitions),
                                    ("model", model_transitions, policy.flap_model_transitions)):
        for subject in sorted(tracks):
            q = active(kind, subject, tracks[subject], now,  # type: ignore[arg-type]
                       window=window, threshold=threshold, base=base, cap=cap)
            if q is not None:
                out.append(q)
    return tuple(out)


def quarantined(qs: Sequence[FlapQuarantine], kind: FlapQuarantineKind) -> frozenset[str]:
    """The subjects of one kind."""
    return frozenset(q.subject for q in qs if q.kind == kind)
