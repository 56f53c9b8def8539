"""The ingress's pure parts: its budgets per (host, kind), and what a relayed message carries."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from grid.controller.ingress import (
    INGRESS_POLICIES,
    MAX_MSG_ID,
    MSG_ID_HEADER,
    UNKNOWN_KIND,
    UNSIGNED,
    IngressBudget,
    relayed_headers,
)
from grid.events.authorship import SIG_HEADER, SIGNER_HEADER
from grid.events.subjects import HOST_EVENT_KINDS
from grid.projections.budget import (
    HOST_BURST_BYTES,
    HOST_BURST_MESSAGES,
    HOST_BYTES_PER_SECOND,
    HOST_RATE_PER_SECOND,
    OVER_RATE,
)
from grid.transport.jetstream import HOST_SUBJECT_HISTORY

SIGNED = {SIG_HEADER: "sig", SIGNER_HEADER: "signer"}


def test_the_ingress_budgets_sum_inside_the_folds_own_per_host_budget() -> None:
    """What an ingress admits, the folds' second line never drops (grid.projections.budget)."""
    policies = INGRESS_POLICIES.values()
    assert set(INGRESS_POLICIES) == set(HOST_EVENT_KINDS)
    assert sum(p.rate_per_second for p in policies) < HOST_RATE_PER_SECOND
    assert sum(p.burst_messages for p in policies) < HOST_BURST_MESSAGES
    assert sum(p.bytes_per_second for p in policies) < HOST_BYTES_PER_SECOND
    assert sum(p.burst_bytes for p in policies) < HOST_BURST_BYTES


def test_a_flooder_needs_most_of_a_minute_to_turn_its_own_heartbeat_history_over() -> None:
    """And an honest agent heartbeating every 0.2 s (the fastest interval the test fleets run)
    stays within its budget."""
    heartbeat = INGRESS_POLICIES["heartbeat"]
    assert (HOST_SUBJECT_HISTORY - heartbeat.burst_messages) / heartbeat.rate_per_second >= 45
    assert heartbeat.rate_per_second >= 1 / 0.2 * 1.5


def test_each_kind_has_its_own_bucket_and_each_host_its_own() -> None:
    budget = IngressBudget()
    burst = int(INGRESS_POLICIES["heartbeat"].burst_messages)
    verdicts = [budget.admit("h1", "heartbeat", 100, 0.0) for _ in range(burst + 1)]
    assert verdicts[:burst] == [None] * burst and verdicts[-1] == OVER_RATE
    assert budget.admit("h1", "ack", 100, 0.0) is None
    assert budget.admit("h2", "heartbeat", 100, 0.0) is None
    assert budget.admit("h1", "heartbeat", 100, 1.0) is None  # a second refills one
    assert budget.admit("h1", "nonsense", 100, 1.0) == UNKNOWN_KIND
    budget.refuse("h1", UNSIGNED, 2.0)
    flagged = budget.flagged
    assert set(flagged) == {"h1"}
    assert flagged["h1"].dropped == {OVER_RATE: 1, UNKNOWN_KIND: 1, UNSIGNED: 1}
    assert (flagged["h1"].first_at, flagged["h1"].last_at) == (0.0, 2.0)


@given(host=st.sampled_from(["a", "b"]), own=st.one_of(st.none(), st.text(max_size=200)),
       data=st.binary(max_size=64), kind=st.sampled_from(HOST_EVENT_KINDS))
def test_a_relayed_message_id_is_the_hosts_own_under_its_token_and_the_same_from_every_controller(
        host: str, own: str | None, data: bytes, kind: str) -> None:
    headers = {**SIGNED, **({MSG_ID_HEADER: own} if own is not None else {}), "Nats-TTL": "1s"}
    first = relayed_headers(host, kind, data, headers)
    assert first == relayed_headers(host, kind, data, dict(headers))  # every controller's copy alike
    assert set(first) == {SIG_HEADER, SIGNER_HEADER, MSG_ID_HEADER}
    msg_id = first[MSG_ID_HEADER]
    assert msg_id.startswith(f"{host}:") and len(msg_id) <= len(host) + 1 + MAX_MSG_ID
    if own and len(own) <= MAX_MSG_ID:
        assert msg_id == f"{host}:{own}"
    other = "b" if host == "a" else "a"
    assert relayed_headers(other, kind, data, headers)[MSG_ID_HEADER] != msg_id
