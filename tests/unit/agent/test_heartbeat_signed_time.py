"""The time an agent signs its heartbeat with: its own clock while it agrees with the log
server's, the server's when it does not, and always after the last one it signed (the folds take
a heartbeat only when its signed time is newer than the last and within the skew of receipt)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from grid.agent.heartbeat import CLOCK_OFF_SECONDS, signed_time
from grid.events.authorship import SIGNED_TIME_SKEW_SECONDS, heartbeat_replay

T0 = 1_800_000_000.0


def test_a_clock_that_agrees_with_the_server_signs_as_it_reads() -> None:
    assert signed_time(T0, None, None) == T0
    assert signed_time(T0, T0 + CLOCK_OFF_SECONDS, T0 - 2) == T0


def test_a_wrong_clock_signs_with_the_servers_time() -> None:
    assert signed_time(T0 - 3600, T0, None) == T0
    assert signed_time(T0 + 60, T0, None) == T0
    assert CLOCK_OFF_SECONDS < SIGNED_TIME_SKEW_SECONDS


def test_a_clock_stepped_back_still_signs_after_the_last() -> None:
    assert signed_time(T0 - 1, None, T0) > T0


@given(offset=st.floats(-7200, 7200), beats=st.lists(st.floats(0.001, 5.0), min_size=1, max_size=30))
def test_whatever_the_hosts_clock_its_heartbeats_are_folded(offset: float, beats: list[float]) -> None:
    """A host whose clock is off by any amount, beating at any intervals, with the server's time
    known (to within a publish's latency): every heartbeat passes the folds' freshness rule."""
    server, last = T0, None
    for gap in beats:
        server += gap
        at = signed_time(server + offset, server - 0.05, last)
        assert heartbeat_replay(last, at, server) is None
        last = at
