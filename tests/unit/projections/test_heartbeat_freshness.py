"""A heartbeat is folded only when its signed time is newer than the host's last folded one and
within the allowed skew of its receipt time; otherwise it is rejected (`stale_replay`,
`signed_ahead`), counted by reason, and changes no state.

The runner folds real signed messages (a host identity's ed25519 signature over subject +
payload, verified against the grid's account as the controller verifies them); only the stored
messages' receipt times and order are chosen by the test, as a JetStream server would stamp them.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grid.agent.options import AgentOptions
from grid.events import codec
from grid.events.authorship import (
    SIGNED_AHEAD,
    SIGNED_TIME_SKEW_SECONDS,
    STALE_REPLAY,
    heartbeat_replay,
)
from grid.events.log import StoredMessage
from grid.events.subjects import HOSTS_STREAM, host_subject
from grid.fleet import HEARTBEAT_TIMEOUT_SECONDS
from grid.projections.runner import FLEET, PLACED, ProjectionRunner
from grid.identity.signing import Identity
from tests import heartbeats
from tests.identities import Identities

T0 = 1_800_000_000.0
SKEW = SIGNED_TIME_SKEW_SECONDS


@pytest.fixture(scope="module")
def ids(tmp_path_factory: pytest.TempPathFactory) -> Identities:
    return Identities(tmp_path_factory.mktemp("grid"))


_seq = itertools.count(1)


def stored(author: Identity, host: str, signed_at: float, received_at: float, seq: int, *,
           event_id: str | None = None) -> StoredMessage:
    """`host`'s heartbeat signed at `signed_at` by `author`, as the server stored it at `seq`."""
    subject = host_subject(host, "heartbeat")
    data = codec.encode(heartbeats.heartbeat(host, at=signed_at, event_id=event_id or f"hb-{next(_seq)}"))
    return StoredMessage(HOSTS_STREAM, seq, subject, data, received_at, headers=author.sign(subject, data))


def runner(ids: Identities) -> ProjectionRunner:
    return ProjectionRunner((FLEET, PLACED), authorship=ids.controller)


# --- the rule itself ----------------------------------------------------------------------------


def test_the_rule() -> None:
    assert heartbeat_replay(None, T0, T0) is None
    assert heartbeat_replay(T0 - 2, T0, T0) is None
    assert heartbeat_replay(T0, T0, T0) == STALE_REPLAY  # the same heartbeat again
    assert heartbeat_replay(T0 + 1, T0, T0 + 2) == STALE_REPLAY  # older than the last folded
    assert heartbeat_replay(None, T0 - SKEW, T0) is None  # at the edge of the skew
    assert heartbeat_replay(None, T0 - SKEW - 0.001, T0) == STALE_REPLAY
    assert heartbeat_replay(None, T0 - 300, T0) == STALE_REPLAY  # the attack: five minutes old
    assert heartbeat_replay(None, T0 + SKEW, T0) is None
    assert heartbeat_replay(None, T0 + SKEW + 0.001, T0) == SIGNED_AHEAD


def test_the_skew_sits_between_the_heartbeat_interval_and_the_timeout() -> None:
    # Several default intervals of publish delay are tolerated...
    assert SKEW >= 4 * dataclasses.fields(AgentOptions)[[f.name for f in dataclasses.fields(AgentOptions)]
                                                      .index("heartbeat_interval")].default
    # ...and an accepted heartbeat never describes the host as of longer ago than the grid lets
    # a host be silent before it is stale.
    assert SKEW < HEARTBEAT_TIMEOUT_SECONDS


# --- the runner's fold ---------------------------------------------------------------------------


def test_an_older_heartbeat_published_again_is_rejected_and_changes_nothing(ids: Identities) -> None:
    r = runner(ids)
    host = ids.host("h1")
    first = stored(host, "h1", T0, T0 + 0.1, 1)
    newer = stored(host, "h1", T0 + 2, T0 + 2.1, 2)
    assert r.fold(first) and r.fold(newer)
    before = r.states["fleet"]
    # The host's own first heartbeat, byte for byte, stored again later (within the skew).
    replay = StoredMessage(HOSTS_STREAM, 3, first.subject, first.data, T0 + 3, headers=first.headers)
    assert r.fold(replay) is False
    assert r.states["fleet"] is before
    assert r.rejected == {STALE_REPLAY: 1}
    assert r.gate.rejections[-1].reason == STALE_REPLAY and r.gate.rejections[-1].seq == 3
    assert r.positions[HOSTS_STREAM] == 3  # skipped, not stuck
    # Signed five minutes before its receipt: rejected whatever came before it.
    assert r.fold(stored(host, "h1", T0 + 4 - 300, T0 + 4, 4)) is False
    assert r.fold(stored(ids.host("h2"), "h2", T0 + 4 - 300, T0 + 4, 5)) is False  # a host never folded
    assert r.fold(stored(host, "h1", T0 + 60, T0 + 5, 6)) is False  # dated ahead
    assert r.rejected == {STALE_REPLAY: 3, SIGNED_AHEAD: 1}
    assert r.states["fleet"] is before
    # An honest sequence goes on as before.
    assert r.fold(stored(host, "h1", T0 + 6, T0 + 6.05, 7))
    assert r.states["fleet"].hosts["h1"].heartbeat.at == T0 + 6
    assert r.states["fleet"].hosts["h1"].heartbeat_seq == 7


def test_an_unsigned_log_folds_as_before(ids: Identities) -> None:
    """Without identities nothing is signed, so `at` proves nothing: the rule does not apply."""
    r = ProjectionRunner((FLEET,))
    old = stored(ids.host("h1"), "h1", T0 - 300, T0, 1)
    assert r.fold(old) and r.fold(msgspec.structs.replace(old, seq=2))
    assert r.rejected == {}
    assert r.states["fleet"].hosts["h1"].heartbeat_seq == 2


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    beats=st.lists(
        st.tuples(st.sampled_from(("h1", "h2")), st.floats(0, 120), st.floats(-2 * SKEW, 2 * SKEW)),
        min_size=1, max_size=24,
    ),
    order=st.randoms(use_true_random=False),
)
def test_an_older_signed_heartbeat_never_replaces_a_newer_one_whatever_the_order(
        ids: Identities, beats: list[tuple[str, float, float]], order: object) -> None:
    """Heartbeats signed at any times, stored in any order, each received near or far from its
    signed time: the fleet's heartbeat for a host only ever moves to a newer signed time, every
    folded one was within the skew of its receipt, and every other one was counted as rejected."""
    signed = [(host, T0 + t, T0 + t + offset) for host, t, offset in beats]
    order.shuffle(signed)  # type: ignore[attr-defined]
    authors = {h: ids.host(h) for h in ("h1", "h2")}
    r = runner(ids)
    folded = 0
    for seq, (host, signed_at, received_at) in enumerate(signed, start=1):
        before = r.states["fleet"].hosts.get(host)
        last = None if before is None or before.heartbeat is None else before.heartbeat.at
        ok = r.fold(stored(authors[host], host, signed_at, received_at, seq))
        after = r.states["fleet"].hosts.get(host)
        if ok:
            folded += 1
            assert after is not None and after.heartbeat is not None and after.heartbeat.at == signed_at
            assert last is None or signed_at > last
            assert abs(signed_at - received_at) <= SKEW
        else:
            assert after is before  # nothing about the host changed
            assert (last is not None and signed_at <= last) or abs(signed_at - received_at) > SKEW
    assert folded + sum(r.rejected.values()) == len(signed)
    assert set(r.rejected) <= {STALE_REPLAY, SIGNED_AHEAD}
    # Replaying the same stored messages into a new runner gives the same verdicts.
    again = runner(ids)
    for seq, (host, signed_at, received_at) in enumerate(signed, start=1):
        again.fold(stored(authors[host], host, signed_at, received_at, seq))
    assert again.rejected == r.rejected
    assert {h: rec.heartbeat_seq for h, rec in again.states["fleet"].hosts.items()} == \
        {h: rec.heartbeat_seq for h, rec in r.states["fleet"].hosts.items()}


# --- snapshots -----------------------------------------------------------------------------------


def test_the_rule_survives_a_snapshot_and_an_older_snapshot_still_restores(ids: Identities) -> None:
    host = ids.host("h1")
    r = runner(ids)
    first = stored(host, "h1", T0, T0, 1)
    r.fold(first)
    r.fold(stored(host, "h1", T0 + 2, T0 + 2, 2))
    replay = StoredMessage(HOSTS_STREAM, 3, first.subject, first.data, T0 + 3, headers=first.headers)
    data = r.snapshot_bytes()

    restored = runner(ids)
    restored.restore_bytes(data)
    assert restored.gate.heartbeats == {"h1": T0 + 2}
    assert restored.fold(replay) is False and restored.rejected == {STALE_REPLAY: 1}

    # A snapshot written before the runner kept heartbeats (no such key) restores, and the
    # fleet state's heartbeats stand in for them.
    raw = msgspec.json.decode(data)
    del raw["heartbeats"]
    older = runner(ids)
    older.restore_bytes(msgspec.json.encode(raw))
    assert older.gate.heartbeats == {"h1": T0 + 2}
    assert older.fold(replay) is False and older.rejected == {STALE_REPLAY: 1}
