"""How long the gateway lets an answer be silent: the agent's own promise of progress markers
(grid.infer.wire.H_PROGRESS) sets it, within sane limits, whatever the agent sent."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from grid.infer import wire
from grid.infer.client import MIN_SILENCE_SECONDS, PROGRESS_MISSES, silence_bound

READ_TIMEOUT = 600.0


def test_an_agent_that_promised_markers_is_given_several_of_its_gaps() -> None:
    assert silence_bound({wire.H_PROGRESS: "2"}, READ_TIMEOUT) == PROGRESS_MISSES * 2.0
    assert silence_bound({wire.H_PROGRESS: f"{wire.PROGRESS_MAX_GAP_SECONDS:g}"}, READ_TIMEOUT) \
        == PROGRESS_MISSES * wire.PROGRESS_MAX_GAP_SECONDS < 10.0


def test_an_agent_that_promised_nothing_gets_the_read_timeout() -> None:
    # An older agent sends its single marker and message 0 without the header.
    assert silence_bound({}, READ_TIMEOUT) is None
    assert silence_bound(None, READ_TIMEOUT) is None
    assert silence_bound({wire.H_WORKING: "1"}, READ_TIMEOUT) is None


def test_hostile_or_broken_promises_stay_within_limits() -> None:
    assert silence_bound({wire.H_PROGRESS: "0"}, READ_TIMEOUT) == MIN_SILENCE_SECONDS
    assert silence_bound({wire.H_PROGRESS: "-5"}, READ_TIMEOUT) == MIN_SILENCE_SECONDS
    assert silence_bound({wire.H_PROGRESS: "inf"}, READ_TIMEOUT) == READ_TIMEOUT
    assert silence_bound({wire.H_PROGRESS: "nan"}, READ_TIMEOUT) is None
    assert silence_bound({wire.H_PROGRESS: "soon"}, READ_TIMEOUT) is None


@given(st.text(max_size=40))
def test_any_header_value_gives_a_bound_within_the_read_timeout_or_none(value: str) -> None:
    bound = silence_bound({wire.H_PROGRESS: value}, READ_TIMEOUT)
    assert bound is None or MIN_SILENCE_SECONDS <= bound <= READ_TIMEOUT
