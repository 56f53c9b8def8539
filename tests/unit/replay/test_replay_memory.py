"""Replay over the in-process log twin, an export file and a real DuckDB store."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from grid.analytics.sink import AnalyticsSink, open_store
from grid.cli.events import _ndjson_line
from grid.clock import SimulatedClock
from grid.controller.tick import PROJECTIONS
from grid.events.log import InMemoryLog
from grid.events.subjects import (
    ALL_STREAMS,
    HOSTS_STREAM,
    PLANS_STREAM,
    REQUESTS_STREAM,
    host_subject,
)
from grid.fleet.planning import Policy
from grid.projections.runner import ProjectionRunner, ReplayError
from replay import (
    DuckDBSource,
    FileSource,
    LogSource,
    SourceError,
    Window,
    extract_window,
    replay_window,
    store,
    write_result,
)
from tests.unit.replay.session import Session


@pytest.fixture
async def recorded() -> tuple[InMemoryLog, Session]:
    clock = SimulatedClock(1_800_000_000.0)
    log = InMemoryLog(clock)
    session = Session(log, clock, hosts=4, models=3)
    await session.run(rounds=6)
    return log, session


async def export(log: InMemoryLog, path: Path) -> Path:
    with open(path, "wb") as f:
        for stream in ALL_STREAMS:
            async for msg in log.replay(stream):
                f.write(_ndjson_line(msg.stream, msg.seq, msg.subject, msg.time, msg.data))
    return path


async def test_every_recorded_plan_reproduces_byte_for_byte(recorded) -> None:
    log, session = recorded
    result = await replay_window(LogSource(log))
    assert result.summary.plans_compared == len(session.plans) == 6
    assert result.summary.identical == 6 and result.summary.digest_mismatches == 0
    assert result.reproduced
    assert [p.plan_seq for p in result.plans] == [1, 2, 3, 4, 5, 6]
    assert all(p.recorded_digest == p.replayed_digest for p in result.plans)
    assert result.events_folded > 0 and not result.warnings


async def test_window_by_sequence_and_by_time(recorded) -> None:
    log, session = recorded
    by_seq = await replay_window(LogSource(log), Window(start_seq=2, end_seq=4))
    assert [p.plan_seq for p in by_seq.plans] == [2, 3, 4]
    t = [p.now for p in session.plans]
    by_time = await replay_window(LogSource(log), Window(start_time=t[3], end_time=t[4]))
    assert [p.plan_seq for p in by_time.plans] == [4, 5]
    assert by_time.reproduced
    empty = await replay_window(LogSource(log), Window(start_time=t[-1] + 1))
    assert empty.summary.plans_compared == 0


async def test_candidate_planner_differences_carry_both_explanations(recorded) -> None:
    log, _ = recorded
    result = await replay_window(LogSource(log), planner="tests.unit.replay.planners:without_first_host")
    assert result.summary.differing > 0
    diffs = [d for p in result.plans for d in p.differences]
    moved = [d for d in diffs if d.kind == "placement" and d.host_id == "host-0"]
    assert moved and all(d.change == "removed" for d in moved)
    assert all(d.recorded_explanation and d.replayed_explanation for d in diffs)
    # The inputs were rebuilt exactly: only the planner differs.
    assert result.summary.digest_mismatches == 0

    same = await replay_window(LogSource(log), planner="tests.unit.replay.planners:renamed_version")
    assert same.summary.equivalent == same.summary.plans_compared
    assert not same.reproduced


async def test_a_planner_that_raises_names_the_plan(recorded) -> None:
    log, _ = recorded
    with pytest.raises(ReplayError) as info:
        await replay_window(LogSource(log), planner="tests.unit.replay.planners:broken")
    assert info.value.stream == PLANS_STREAM and info.value.seq == 1
    assert "tests.unit.replay.planners:broken" in str(info.value)


async def test_malformed_event_in_window_names_its_sequence(recorded) -> None:
    log, session = recorded
    bad = await log.append_raw(host_subject("host-1", "heartbeat"), b'{"type":"host.heartbeat.v1","oops":')
    await session.tick()  # a later plan is based on the malformed event
    with pytest.raises(ReplayError) as info:
        await replay_window(LogSource(log))
    assert (info.value.stream, info.value.seq) == (HOSTS_STREAM, bad.seq)
    # Plans before it still replay.
    ok = await replay_window(LogSource(log), Window(end_seq=6))
    assert ok.reproduced


async def test_export_file_replays_identically(recorded, tmp_path) -> None:
    log, _ = recorded
    path = await export(log, tmp_path / "session.ndjson")
    result = await replay_window(FileSource(path))
    assert result.reproduced and result.summary.plans_compared == 6
    assert result.source == "file"


async def test_export_file_with_a_gap_names_the_missing_sequence(recorded, tmp_path) -> None:
    log, _ = recorded
    path = await export(log, tmp_path / "session.ndjson")
    lines = path.read_bytes().splitlines(keepends=True)
    victim = next(i for i, line in enumerate(lines)
                  if json.loads(line)["stream"] == HOSTS_STREAM and json.loads(line)["seq"] == 7)
    gapped = tmp_path / "gapped.ndjson"
    gapped.write_bytes(b"".join(lines[:victim] + lines[victim + 1:]))
    with pytest.raises(ReplayError) as info:
        FileSource(gapped)
    assert (info.value.stream, info.value.seq) == (HOSTS_STREAM, 7)
    assert "missing 7" in str(info.value)

    garbage = tmp_path / "garbage.ndjson"
    garbage.write_bytes(b"".join(lines[:3]) + b"not json\n")
    with pytest.raises(SourceError, match="line 4"):
        FileSource(garbage)
    with pytest.raises(SourceError, match="does not exist"):
        FileSource(tmp_path / "absent.ndjson")


async def test_exported_malformed_event_names_its_sequence(recorded, tmp_path) -> None:
    log, session = recorded
    bad = await log.append_raw(host_subject("host-2", "heartbeat"), b"\xff\xfe not an event")
    await session.tick()
    path = await export(log, tmp_path / "session.ndjson")
    with pytest.raises(ReplayError) as info:
        await replay_window(FileSource(path))
    assert (info.value.stream, info.value.seq) == (HOSTS_STREAM, bad.seq)


async def test_duckdb_store_replays_identically_and_refuses_gaps(recorded) -> None:
    log, _ = recorded
    con = open_store(":memory:")
    sink = AnalyticsSink(con)
    await sink.sync(log)
    sink.close()
    source = DuckDBSource(con)
    result = await replay_window(source)
    assert result.reproduced and result.summary.plans_compared == 6
    assert source.lossy_request_batches == 0 and not result.warnings  # the sink keeps batch payloads

    # A store written before the sink kept batch payloads: batches are rebuilt from request_features.
    assert REQUESTS_STREAM in ProjectionRunner(PROJECTIONS).streams
    con.execute("UPDATE events SET payload = '' WHERE type = 'request.batch.v1'")
    legacy = DuckDBSource(con)
    result = await replay_window(legacy)
    assert legacy.lossy_request_batches > 0
    assert any("request_features" in w for w in result.warnings)
    assert result.reproduced  # this session's records use none of the fields the rows lack

    con.execute("DELETE FROM events WHERE stream = ? AND seq = 5", [HOSTS_STREAM])
    with pytest.raises(ReplayError) as info:
        await replay_window(DuckDBSource(con))
    assert (info.value.stream, info.value.seq) == (HOSTS_STREAM, 5)
    assert "gap" in str(info.value)
    con.close()


async def test_results_are_stored_by_run_id(recorded) -> None:
    log, _ = recorded
    con = duckdb.connect(":memory:")
    result = await replay_window(LogSource(log), planner="tests.unit.replay.planners:without_first_host")
    write_result(con, result)
    [run] = store.runs(con)
    assert run["run_id"] == result.run_id
    assert run["plans_compared"] == 6 and run["differing"] == result.summary.differing
    plans = store.run_plans(con, result.run_id)
    assert [p["plan_seq"] for p in plans] == [1, 2, 3, 4, 5, 6]
    diffs = store.run_diffs(con, result.run_id)
    assert len(diffs) == sum(len(p.differences) for p in result.plans) > 0
    assert store.find_run(con, result.run_id[:8]) == result.run_id
    con.close()


async def test_based_on_ahead_of_the_input_is_diagnosed_and_the_plan_still_reproduced(recorded) -> None:
    log, session = recorded
    drifted = await session.tick(drift=True)  # based_on includes heartbeats folded after planning
    result = await replay_window(LogSource(log))
    last = result.plans[-1]
    assert last.plan_seq == 7 and not last.digest_match
    assert last.input_positions is not None
    # The input was planned before the drift's heartbeats; the agents' acks of the previous
    # plan's commands change no input, so the earliest position after that plan matches too.
    previous = session.plans[-2].based_on[HOSTS_STREAM]
    assert previous <= last.input_positions[HOSTS_STREAM] <= drifted.based_on[HOSTS_STREAM] - len(session.hosts)
    assert "ran ahead" in last.diagnosis
    assert last.status == "identical"  # the plan is reproduced byte for byte from the input it was planned from
    assert result.summary.based_on_drift == 1 and result.summary.digest_mismatches == 1
    assert not result.reproduced
    assert any("based_on ahead" in w for w in result.warnings)
    # Without the diagnosis the mismatch is only counted.
    plain = await replay_window(LogSource(log), diagnose=False)
    assert plain.plans[-1].input_positions is None and plain.summary.based_on_drift == 0


async def test_extract_a_window_by_sequence_or_time_from_every_source(recorded, tmp_path) -> None:
    log, _ = recorded
    everything = [m async for m in log.replay(HOSTS_STREAM)]
    t_lo, t_hi = everything[10].time, everything[20].time
    expected_time = [m.seq for m in everything if t_lo <= m.time <= t_hi]
    con = open_store(":memory:")
    sink = AnalyticsSink(con)
    await sink.sync(log)
    sink.close()
    path = await export(log, tmp_path / "window.ndjson")
    for source in (LogSource(log), FileSource(path), DuckDBSource(con)):
        by_seq = [m async for m in extract_window(source, HOSTS_STREAM, start_seq=5, end_seq=9)]
        assert [m.seq for m in by_seq] == [5, 6, 7, 8, 9]
        assert [m.data for m in by_seq] == [m.data for m in everything[4:9]]
        by_time = [m.seq async for m in extract_window(source, HOSTS_STREAM, start_time=t_lo, end_time=t_hi)]
        assert by_time == expected_time, source.kind
    con.close()


async def test_recurring_drift_is_diagnosed_on_every_plan(recorded) -> None:
    log, session = recorded
    for i in range(5):
        await session.tick(drift=i % 2 == 0)  # drift, clean, drift, clean, drift
        await session.requests()
    for _ in range(2):
        await session.tick(drift=True)
    result = await replay_window(LogSource(log))
    drifted = [p.plan_seq for p in result.plans if not p.digest_match]
    assert drifted == [7, 9, 11, 12, 13]  # more than MAX_DIAGNOSES: later ones use the trailing runner
    assert result.summary.based_on_drift == 5
    assert result.summary.identical == result.summary.plans_compared == 13


# A policy that changes the planner input (and so its digest) but not the session's decisions.
NON_DEFAULT_POLICY = Policy(max_evictions=3, explain_host_limit=2, heartbeat_timeout_seconds=45.0)


async def test_a_controller_with_a_non_default_policy_is_reproduced() -> None:
    clock = SimulatedClock(1_800_000_000.0)
    log = InMemoryLog(clock)
    await Session(log, clock, policy=NON_DEFAULT_POLICY).run(rounds=3)
    result = await replay_window(LogSource(log))
    assert result.summary.plans_compared == 3
    assert result.reproduced and result.summary.digest_mismatches == 0


async def test_plans_recorded_without_a_policy_replay_under_the_default_policy() -> None:
    clock = SimulatedClock(1_800_000_000.0)
    log = InMemoryLog(clock)
    await Session(log, clock, record_policy=False).run(rounds=3)  # as recorded before the field existed
    assert (await replay_window(LogSource(log))).reproduced
    # Without the record, a non-default policy cannot be known: reported, not silently matched.
    clock = SimulatedClock(1_800_000_000.0)
    log = InMemoryLog(clock)
    await Session(log, clock, policy=NON_DEFAULT_POLICY, record_policy=False).run(rounds=3)
    result = await replay_window(LogSource(log), diagnose=False)
    assert result.summary.digest_mismatches == 3 and not result.reproduced
