"""The planner gate: the recorded corpus must keep producing its expected plans.

tests/golden/planner_corpus/ holds the log of a real namespace test fleet (`gridctl test start
--machines 3 --netns --capacities-gib 1,5,5`, real engines) running the adaptive workday of
`gridctl test demo --workload-model ...` (real requests through the gateway: a coding specialist
and a shared model loaded for four workload classes, a surge that preempted both and scaled the
baseline to three, the return after it, the cooldown), exported with `gridctl events export`,
and the plans the planner is expected to make from it (recorded with `python -m replay.record`).
Replaying it with the current planner must give exactly those plans. When it does not, the
failure lists the models whose placements changed and each side's explanation.

A planner change that is meant to change decisions raises PLANNER_VERSION (grid/planner/plan.py)
and regenerates the expected plans with

    python -m replay.gate --regenerate

whose printed summary goes in the commit message. `python -m replay.gate` alone runs this check.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
from pathlib import Path

import msgspec
import pytest

from grid.fleet.planning import decode_plan, encode_plan
from grid.planner.plan import PLANNER_VERSION
from replay.gate import (
    CORPUS_CHANGED,
    DEFAULT_CORPUS,
    EVENTS_FILE,
    EXPECTED_PLANS_FILE,
    MANIFEST_FILE,
    PLANS_DIFFER,
    REGENERATE_COMMAND,
    REGENERATION_NEEDS_VERSION,
    VERSION_NOT_REGENERATED,
    ExpectedPlan,
    Rerun,
    compare,
    load_expected,
    regenerate,
    rerun_corpus,
    summary_lines,
)


@pytest.fixture(scope="module")
async def rerun() -> Rerun:
    return await rerun_corpus(DEFAULT_CORPUS)


def test_the_current_planner_makes_the_expected_plans(rerun: Rerun) -> None:
    expected = load_expected(DEFAULT_CORPUS)
    report = compare(expected, rerun)
    assert report.passed, "\n" + "\n".join(summary_lines(report))
    assert report.plans_compared == expected.manifest.plans == len(expected.plans)
    # The export was verified against the account key it records: nothing skipped, nothing unverified.
    assert rerun.replay.rejections == ()
    assert not [w for w in rerun.replay.warnings if "without verifying" in w]
    # The window is one that matters: placements changed over it.
    shapes = {tuple(sorted((p.model_id, p.host_id) for p in decode_plan(bytes(e.plan)).placements))
              for e in expected.plans}
    assert len(shapes) >= 3


@pytest.fixture(scope="module")
def as_expected(rerun: Rerun) -> Rerun:
    """A re-run that made exactly the expected plans: the gate's own tests below do not depend on
    whether the current planner still makes them (the test above says that)."""
    expected = load_expected(DEFAULT_CORPUS)
    return dataclasses.replace(rerun, planner_version=expected.manifest.planner_version, plans=expected.plans)


def _edited(rerun: Rerun, edit) -> Rerun:  # type: ignore[no-untyped-def]
    """`rerun` with `edit` applied to every plan it made: a planner that decides differently."""
    plans = tuple(
        ExpectedPlan(plan_seq=p.plan_seq, time=p.time, inputs_digest=p.inputs_digest,
                     plan=msgspec.Raw(encode_plan(edit(decode_plan(bytes(p.plan))))))
        for p in rerun.plans
    )
    return dataclasses.replace(rerun, plans=plans)


def _newest_placed_model(rerun: Rerun) -> str:
    """The model placed last for the first time in the window (a model demand brought in)."""
    seen: list[str] = []
    for p in rerun.plans:
        for placement in decode_plan(bytes(p.plan)).placements:
            if placement.model_id not in seen:
                seen.append(placement.model_id)
    return seen[-1]


def _without(model: str):  # type: ignore[no-untyped-def]
    def edit(plan):  # type: ignore[no-untyped-def]
        return msgspec.structs.replace(plan, placements=tuple(p for p in plan.placements if p.model_id != model))
    return edit


def test_a_changed_decision_fails_with_the_models_that_changed(as_expected: Rerun) -> None:
    model = _newest_placed_model(as_expected)
    report = compare(load_expected(DEFAULT_CORPUS), _edited(as_expected, _without(model)))
    text = "\n".join(summary_lines(report))
    assert report.failures == [PLANS_DIFFER]
    touched = {d.model_id for c in report.changes for d in c.differences}
    assert touched == {model}
    assert f"  {model}: decisions differ in" in text
    assert f"placement {model}@" in text and "removed" in text
    assert "      expected: reason " in text and "      now: " in text  # each side's explanation
    assert "raise PLANNER_VERSION" in text and REGENERATE_COMMAND in text


def _stamped(version: str):  # type: ignore[no-untyped-def]
    def edit(plan):  # type: ignore[no-untyped-def]
        return msgspec.structs.replace(plan, planner_version=version)
    return edit


def test_a_raised_version_fails_until_the_plans_are_regenerated(as_expected: Rerun, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    shutil.copytree(DEFAULT_CORPUS, corpus)
    raised = f"{PLANNER_VERSION}+next"
    same_decisions = dataclasses.replace(_edited(as_expected, _stamped(raised)), planner_version=raised)
    report = compare(load_expected(corpus), same_decisions)
    assert report.failures == [VERSION_NOT_REGENERATED] and not report.changes
    assert REGENERATE_COMMAND in summary_lines(report)[-1]

    outcome = regenerate(corpus, same_decisions)
    assert outcome.written
    assert compare(load_expected(corpus), same_decisions).passed
    assert load_expected(corpus).manifest.planner_version == raised


def test_regeneration_is_refused_while_the_version_is_unchanged(as_expected: Rerun, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    shutil.copytree(DEFAULT_CORPUS, corpus)
    before = {(corpus / f).read_bytes() for f in (EXPECTED_PLANS_FILE, MANIFEST_FILE)}
    changed = _edited(as_expected, _without(_newest_placed_model(as_expected)))
    outcome = regenerate(corpus, changed)
    assert not outcome.written
    assert REGENERATION_NEEDS_VERSION in outcome.report.failures
    assert "raise it" in outcome.reason
    assert {(corpus / f).read_bytes() for f in (EXPECTED_PLANS_FILE, MANIFEST_FILE)} == before


def _rescored(model: str):  # type: ignore[no-untyped-def]
    def edit(plan):  # type: ignore[no-untyped-def]
        return msgspec.structs.replace(plan, placements=tuple(
            msgspec.structs.replace(p, score=p.score + 1.0) if p.model_id == model else p for p in plan.placements))
    return edit


def test_a_score_change_alone_fails_and_says_no_decision_changed(as_expected: Rerun) -> None:
    model = _newest_placed_model(as_expected)
    report = compare(load_expected(DEFAULT_CORPUS), _edited(as_expected, _rescored(model)))
    text = "\n".join(summary_lines(report))
    assert report.failures == [PLANS_DIFFER]
    assert all(not c.differences for c in report.changes)
    assert f"  {model}: same decisions, scores or reasons differ in" in text
    assert f"{model}@" in text and " -> " in text
    assert "no placement decision" in summary_lines(report)[-1]


async def test_an_edited_export_is_caught(tmp_path: Path) -> None:
    """The export is verified against the account key it records: an event edited after signing is
    skipped as the live folds skip a forgery, and the export no longer matches the expected plans'."""
    corpus = tmp_path / "corpus"
    shutil.copytree(DEFAULT_CORPUS, corpus)
    lines = gzip.decompress((corpus / EVENTS_FILE).read_bytes()).splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if b'"host.heartbeat.v1"' in line and b'"capacity_mb":1024' in line)
    lines[at] = lines[at].replace(b'"capacity_mb":1024', b'"capacity_mb":8192', 1)
    (corpus / EVENTS_FILE).write_bytes(gzip.compress(b"".join(lines), mtime=0))
    edited = await rerun_corpus(corpus)
    assert [r.seq for r in edited.replay.rejections] == [json.loads(lines[at])["seq"]]
    report = compare(load_expected(corpus), edited)
    assert CORPUS_CHANGED in report.failures
