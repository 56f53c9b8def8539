"""Host budgets (grid.projections.budget): pure functions of receipt times, never unfair to a host
that stays within its budget, identical on replay, and carried by the runner's snapshot."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from grid.events import codec
from grid.events.authorship import SIG_HEADER
from grid.events.log import StoredMessage
from grid.events.subjects import HOSTS_STREAM, host_subject
from grid.projections.budget import (
    OVER_BYTES,
    OVER_RATE,
    BudgetPolicy,
    HostBudget,
    LogThrottle,
    flagged_rows,
    host_token,
)
from grid.projections.runner import CORE_PROJECTIONS, ProjectionRunner
from tests.heartbeats import heartbeat

POLICY = BudgetPolicy(rate_per_second=5.0, burst_messages=20.0, bytes_per_second=10_000.0, burst_bytes=50_000.0)

# A host's messages: (seconds since its previous message, size in bytes).
gaps = st.lists(st.tuples(st.floats(min_value=0.0, max_value=5.0, allow_nan=False), st.integers(0, 2_000)),
                max_size=200)


def _within_budget(steps: list[tuple[float, int]], policy: BudgetPolicy) -> list[tuple[float, int]]:
    """The steps, re-timed so the host never exceeds `policy`: each message comes no sooner than
    one rate period and one byte period (for its size) after the previous one."""
    out, t = [], 0.0
    for gap, size in steps:
        t += max(gap, 1.0 / policy.rate_per_second, size / policy.bytes_per_second)
        out.append((t, size))
    return out


@given(gaps, gaps)
@settings(max_examples=200, deadline=None)
def test_a_host_within_its_budget_is_never_dropped_whatever_another_host_does(
    honest: list[tuple[float, int]], flood: list[tuple[float, int]]
) -> None:
    budget = HostBudget(POLICY)
    timed = _within_budget(honest, POLICY)
    # The flooder sends many messages at the honest host's instants and in between.
    events = [(t, "honest", size) for t, size in timed]
    events += [(t / 7.0, "flooder", size * 10) for t, size in _within_budget(flood, POLICY) for _ in range(5)]
    events.sort(key=lambda e: e[0])
    for t, host, size in events:
        verdict = budget.admit(host_subject(host, "heartbeat"), size, 1_000.0 + t, signed=True)
        if host == "honest":
            assert verdict is None
    assert "honest" not in budget.flagged


@given(st.lists(st.tuples(st.sampled_from(["a", "b.c", "d"]), st.booleans(),
                          st.floats(min_value=0, max_value=3, allow_nan=False), st.integers(0, 30_000)),
                max_size=300))
@settings(max_examples=200, deadline=None)
def test_verdicts_are_a_pure_function_of_the_messages_and_their_receipt_times(
    messages: list[tuple[str, bool, float, int]]
) -> None:
    def run(split: int | None) -> tuple[list[str | None], bytes]:
        budget = HostBudget(POLICY)
        verdicts, t = [], 5_000.0
        for i, (host, signed, gap, size) in enumerate(messages):
            if split is not None and i == split:
                # Restarted from a snapshot of the state: the same verdicts follow.
                budget = HostBudget(POLICY, msgspec.json.decode(codec.encode_value(budget.state),
                                                                type=type(budget.state)))
            t += gap
            verdicts.append(budget.admit(host_subject(host, "ack"), size, t, signed=signed))
        return verdicts, codec.encode_value(budget.state)

    first = run(None)
    assert run(None) == first
    assert run(len(messages) // 2)[0] == first[0]


def test_a_flood_is_dropped_after_the_burst_and_refills_at_the_rate() -> None:
    budget = HostBudget(POLICY)
    subject = host_subject("flooder", "heartbeat")
    verdicts = [budget.admit(subject, 100, 10.0, signed=True) for _ in range(100)]
    assert verdicts[:20] == [None] * 20 and set(verdicts[20:]) == {OVER_RATE}
    # One second later, five more.
    later = [budget.admit(subject, 100, 11.0, signed=True) for _ in range(10)]
    assert later == [None] * 5 + [OVER_RATE] * 5
    # Bytes: one message as large as the burst passes, the next one waits for the byte rate.
    big = HostBudget(POLICY)
    assert big.admit(subject, 50_000, 1.0, signed=True) is None
    assert big.admit(subject, 50_000, 2.0, signed=True) == OVER_BYTES
    assert big.admit(subject, 50_000, 6.0, signed=True) is None
    assert big.admit(subject, 50_001, 100.0, signed=True) == OVER_BYTES  # never affordable
    assert budget.flagged["flooder"].dropped == {OVER_RATE: 85}
    rows = flagged_rows(budget.flagged, now=30.0)
    assert [(r["host"], r["total"], r["over_now"]) for r in rows] == [("flooder", 85, True)]
    assert flagged_rows(budget.flagged, now=1_000.0)[0]["over_now"] is False


def test_unsigned_junk_never_spends_a_hosts_signed_budget() -> None:
    budget = HostBudget(POLICY)
    subject = host_subject("victim", "heartbeat")
    # A reflection (the server's own reply, stored on the victim's subject) carries no signature.
    for _ in range(1_000):
        budget.admit(subject, 10, 1.0, signed=False)
    assert budget.admit(subject, 10, 1.0, signed=True) is None


def test_a_receipt_time_going_back_refills_nothing() -> None:
    budget = HostBudget(POLICY)
    subject = host_subject("h", "ack")
    for _ in range(20):
        assert budget.admit(subject, 1, 100.0, signed=True) is None
    assert budget.admit(subject, 1, 50.0, signed=True) == OVER_RATE
    assert budget.admit(subject, 1, 100.1, signed=True) == OVER_RATE  # 0.1 s after the latest: half a token
    assert budget.admit(subject, 1, 100.2, signed=True) is None


def test_host_tokens_are_read_without_decoding() -> None:
    assert host_token(host_subject("SmolLM2.host", "heartbeat")) == "SmolLM2_2Ehost"
    assert host_token("grid.ctl.mode") is None
    budget = HostBudget(POLICY)
    for _ in range(30):
        budget.admit(host_subject("a.b", "ack"), 1, 1.0, signed=True)
    assert list(budget.flagged) == ["a_2Eb"] and budget.flagged["a_2Eb"].host == "a.b"


def test_idle_buckets_are_forgotten() -> None:
    budget = HostBudget(BudgetPolicy())
    for i in range(5_000):
        budget.admit(host_subject(f"h{i}", "heartbeat"), 100, float(i), signed=True)
    # Every bucket that has refilled completely is dropped at the periodic prune.
    assert len(budget.state.buckets) < 5_000


def test_log_throttle_says_once_per_key_and_interval_and_counts_the_rest() -> None:
    throttle = LogThrottle(interval=10.0)
    said = [throttle.allow(("h", "unsigned"), 100.0 + i * 0.01) for i in range(1_000)]
    assert said[0] == (True, 0) and all(not ok for ok, _ in said[1:])
    assert throttle.allow(("h", "unsigned"), 111.0) == (True, 999)
    assert throttle.allow(("other", "unsigned"), 111.0) == (True, 0)


def _stored(seq: int, host: str, at: float, *, signed: bool = True) -> StoredMessage:
    data = codec.encode(heartbeat(host, at=at))
    headers = {SIG_HEADER: "x"} if signed else None
    return StoredMessage(HOSTS_STREAM, seq, host_subject(host, "heartbeat"), data, at, None, headers)


def test_the_runner_drops_over_budget_before_folding_and_snapshots_the_budget() -> None:
    runner = ProjectionRunner(CORE_PROJECTIONS, budget=HostBudget(POLICY))
    seq = 0
    for i in range(60):
        seq += 1
        runner.fold(_stored(seq, "flooder", 10.0 + i * 1e-3))
    seq += 1
    assert runner.fold(_stored(seq, "honest", 10.5))
    assert runner.rejected == {OVER_RATE: 40}
    assert runner.positions[HOSTS_STREAM] == seq
    assert set(runner["fleet"].hosts) == {"flooder", "honest"}
    restored = ProjectionRunner(CORE_PROJECTIONS, budget=HostBudget(POLICY))
    restored.restore_bytes(runner.snapshot_bytes())
    assert restored.rejected == runner.rejected
    assert restored.budget is not None and restored.budget.state == runner.budget.state  # type: ignore[union-attr]
    # ...and judges the next message exactly as the original does.
    nxt = _stored(seq + 1, "flooder", 10.1)
    assert restored.admit(nxt) == runner.admit(nxt) == OVER_RATE


def test_budgets_are_off_without_identities_unless_asked_for() -> None:
    runner = ProjectionRunner(CORE_PROJECTIONS)
    for seq in range(1, 2_001):
        runner.fold(_stored(seq, "h", 10.0))
    assert runner.budget is None and runner.rejected == {}
