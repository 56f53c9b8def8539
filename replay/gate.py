"""The planner gate: a recorded log window must keep producing the plans it is expected to produce.

A corpus is a directory holding a window of a real fleet's log exported with `gridctl events
export` and gzip-compressed (``events.ndjson.gz``), the plans the planner is expected to make
from it, one line per recorded plan in plans-stream order (``expected_plans.ndjson``: plan
sequence, the digest of the input rebuilt for it, the plan's bytes verbatim), and a manifest
(``expected.json``: the planner version that made them, the sha256 of the uncompressed export).

``compare`` judges a re-run of the export (``rerun_corpus``, the same replay as `gridctl replay`)
against the expected plans. It fails when any plan differs, when the planner version is not the
one the expected plans were made with (raised, but the expected plans were not regenerated), or
when the export is not the one they were made from. Its report (``summary_lines``) lists, per
model, the placements, preemptions and shortfalls that changed with each side's explanation
(``replay.diff``), then the plan fields other than decisions that changed.

``regenerate`` rewrites the expected plans from the current planner. It refuses while plans
differ and the planner version is still the expected one: a planner change that changes
yesterday's decisions says so by raising ``PLANNER_VERSION``. Its summary is the text for the
commit message. Command line: ``python -m replay.gate [--corpus DIR] [--regenerate]``.

The export is verified against the account key it records (no credential is needed), so the
gate runs from a fresh clone.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import hashlib
import sys
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from grid.fleet.planning import Plan, PlannerInput, decode_plan
from replay.diff import Difference, describe, diff_plans
from replay.extract import FileSource, SourceError, Window
from replay.rerun import FOLD_TIME, PlannerPathError, PlannerRef, ReplayResult, load_planner, replay_window

DEFAULT_CORPUS = Path(__file__).resolve().parent.parent / "tests" / "golden" / "planner_corpus"
EVENTS_FILE = "events.ndjson.gz"
EXPECTED_PLANS_FILE = "expected_plans.ndjson"
MANIFEST_FILE = "expected.json"
REGENERATE_COMMAND = "python -m replay.gate --regenerate"

EXIT_PASSED = 0
EXIT_FAILED = 1  # a plan differs, or regeneration was refused
EXIT_BAD_INPUT = 2  # the corpus or the planner path cannot be read

# Why the gate failed (GateReport.failures), each with the fix it points to.
PLANS_DIFFER = "plans_differ"
VERSION_NOT_REGENERATED = "version_not_regenerated"
CORPUS_CHANGED = "corpus_changed"
PLANS_MISSING = "plans_missing"
REGENERATION_NEEDS_VERSION = "regeneration_needs_version"

# Plan fields that are not decisions but still part of the recorded bytes.
_DECISION_FIELDS = ("placements", "preemptions", "shortfalls")
_VERSION_FIELD = "planner_version"


class GateError(Exception):
    """A corpus that cannot be read (missing file, malformed line, unreadable export)."""


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    planner_version: str
    events_sha256: str
    plans: int
    fold_order: str = FOLD_TIME
    regenerate: str = REGENERATE_COMMAND


class ExpectedPlan(msgspec.Struct, frozen=True, kw_only=True):
    plan_seq: int
    time: float
    inputs_digest: str
    # The plan's bytes exactly as the planner encoded them.
    plan: msgspec.Raw


@dataclass(frozen=True)
class Expected:
    manifest: Manifest
    plans: tuple[ExpectedPlan, ...]


@dataclass(frozen=True)
class Rerun:
    """What the planner made of the corpus: one plan per recorded plan, with its rebuilt input digest."""

    planner: str
    planner_version: str
    events_sha256: str
    plans: tuple[ExpectedPlan, ...]
    replay: ReplayResult
    fold_order: str = FOLD_TIME


@dataclass(frozen=True)
class PlanChange:
    plan_seq: int
    differences: tuple[Difference, ...]
    # Non-decision fields whose value differs (explanations, basis, inputs_digest, now).
    other_fields: tuple[str, ...]
    # Placements kept with the same decision whose score or reason changed: (model, "model@host: what").
    rescored: tuple[tuple[str, str], ...] = ()


@dataclass
class GateReport:
    expected_version: str
    current_version: str
    plans_compared: int
    changes: list[PlanChange] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


# --- reading and writing a corpus ---------------------------------------------------------------


_expected_decoder = msgspec.json.Decoder(ExpectedPlan)


def load_expected(corpus: Path) -> Expected:
    manifest_path, plans_path = corpus / MANIFEST_FILE, corpus / EXPECTED_PLANS_FILE
    try:
        manifest = msgspec.json.decode(manifest_path.read_bytes(), type=Manifest)
        lines = plans_path.read_bytes().splitlines()
    except OSError as exc:
        raise GateError(f"corpus {corpus}: {exc} (create it with `{REGENERATE_COMMAND}`)") from exc
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise GateError(f"{manifest_path}: {exc}") from exc
    plans = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            plans.append(_expected_decoder.decode(line))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise GateError(f"{plans_path} line {lineno}: {exc}") from exc
    return Expected(manifest, tuple(plans))


def write_expected(corpus: Path, rerun: Rerun) -> Manifest:
    manifest = Manifest(planner_version=rerun.planner_version, events_sha256=rerun.events_sha256,
                        plans=len(rerun.plans), fold_order=rerun.fold_order)
    body = b"".join(msgspec.json.encode(p) + b"\n" for p in rerun.plans)
    (corpus / EXPECTED_PLANS_FILE).write_bytes(body)
    (corpus / MANIFEST_FILE).write_bytes(msgspec.json.format(msgspec.json.encode(manifest), indent=2) + b"\n")
    return manifest


# --- re-running the corpus ----------------------------------------------------------------------


def _capturing(ref: PlannerRef, into: list[Any]) -> PlannerRef:
    """`ref` with every plan it returns kept, in call order (one call per recorded plan)."""

    def run(inp: PlannerInput) -> Any:
        result = ref.func(inp)
        into.append(result)
        return result

    return PlannerRef(ref.path, run, ref.version, ref.encode)


async def rerun_corpus(corpus: Path, planner: str | PlannerRef | None = None,
                       fold_order: str | None = None) -> Rerun:
    """Replay the corpus's export with `planner` (default the installed one), folding in the
    manifest's order unless `fold_order` is given."""
    if fold_order is None:
        try:
            fold_order = load_expected(corpus).manifest.fold_order
        except GateError:
            fold_order = FOLD_TIME  # a new corpus
    ref = planner if isinstance(planner, PlannerRef) else load_planner(planner)
    made: list[Any] = []
    try:
        exported = gzip.decompress((corpus / EVENTS_FILE).read_bytes())
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise GateError(f"corpus {corpus}: {EVENTS_FILE}: {exc}") from exc
    with tempfile.TemporaryDirectory(prefix="grid-planner-gate-") as scratch:
        events = Path(scratch) / "events.ndjson"
        events.write_bytes(exported)
        try:
            # No operator credential: the export is verified against the account key it records.
            source = FileSource(events, authorship=None)
        except SourceError as exc:
            raise GateError(str(exc)) from exc
        try:
            result = await replay_window(source, Window(), planner=_capturing(ref, made), fold_order=fold_order,
                                         diagnose=False)
        finally:
            await source.close()
    if len(made) != len(result.plans):
        raise GateError(f"{len(made)} plans made for {len(result.plans)} recorded plans")
    plans = tuple(
        ExpectedPlan(plan_seq=o.plan_seq, time=o.time, inputs_digest=o.replayed_digest,
                     plan=msgspec.Raw(ref.encode(p)))
        for o, p in zip(result.plans, made, strict=True)
    )
    version = ref.version or (decode_plan(bytes(plans[0].plan)).planner_version if plans else "")
    return Rerun(ref.path, version, hashlib.sha256(exported).hexdigest(), plans, result, fold_order)


# --- comparing ----------------------------------------------------------------------------------


def _fields(plan: Plan) -> dict[str, Any]:
    return {name: msgspec.to_builtins(getattr(plan, name)) for name in plan.__struct_fields__}


def compare_plans(expected: bytes, made: bytes, seq: int) -> PlanChange | None:
    """How `made` differs from `expected` (None: the same plan, the planner version aside)."""
    if expected == made:
        return None
    a, b = decode_plan(expected), decode_plan(made)
    fa, fb = _fields(a), _fields(b)
    differences = tuple(diff_plans(a, b))
    decided = {d.kind + "s" for d in differences}
    # A decision field that differs with no decision difference differs in scores or reasons.
    others = tuple(name if name not in _DECISION_FIELDS else f"{name} (scores or reasons)"
                   for name in fa if name != _VERSION_FIELD and name not in decided and fa[name] != fb.get(name))
    if not differences and not others:
        return None  # only the version stamp differs
    return PlanChange(seq, differences, others, _rescored(a, b))


def _rescored(a: Plan, b: Plan) -> tuple[tuple[str, str], ...]:
    """Placements both plans make alike whose score or reason differs."""
    made = {(p.model_id, p.host_id): p for p in b.placements}
    out = []
    for p in a.placements:
        q = made.get((p.model_id, p.host_id))
        if q is None or (p.score == q.score and p.reason == q.reason):
            continue
        what = [f"score {p.score:.2f} -> {q.score:.2f}"] if p.score != q.score else []
        if p.reason != q.reason:
            what.append(f"reason {p.reason} -> {q.reason}")
        out.append((p.model_id, f"{p.model_id}@{p.host_id}: {', '.join(what)}"))
    return tuple(out)


def compare(expected: Expected, rerun: Rerun) -> GateReport:
    """The gate's verdict on `rerun` against the corpus's expected plans."""
    m = expected.manifest
    report = GateReport(m.planner_version, rerun.planner_version, len(rerun.plans))
    if rerun.events_sha256 != m.events_sha256:
        report.failures.append(CORPUS_CHANGED)
        report.notes.append(f"{EVENTS_FILE} is not the export the expected plans were made from "
                            f"(sha256 {rerun.events_sha256[:12]}, expected {m.events_sha256[:12]})")
    made = {p.plan_seq: p for p in rerun.plans}
    wanted = {p.plan_seq: p for p in expected.plans}
    if set(made) != set(wanted):
        report.failures.append(PLANS_MISSING)
        missing, extra = sorted(set(wanted) - set(made)), sorted(set(made) - set(wanted))
        report.notes.append(f"plan sequences differ: expected but not re-run {missing[:10]}, "
                            f"re-run but not expected {extra[:10]}")
    for seq in sorted(set(made) & set(wanted)):
        change = compare_plans(bytes(wanted[seq].plan), bytes(made[seq].plan), seq)
        if change is not None:
            report.changes.append(change)
    if report.changes:
        report.failures.append(PLANS_DIFFER)
    if rerun.planner_version != m.planner_version:
        report.failures.append(VERSION_NOT_REGENERATED)
    return report


# --- the readable summary -----------------------------------------------------------------------


def _span(seqs: Sequence[int]) -> str:
    return f"plan {seqs[0]}" if len(seqs) == 1 else f"{len(seqs)} plans, {seqs[0]}..{seqs[-1]}"


def summary_lines(report: GateReport, *, per_model: int = 4) -> list[str]:
    """The report as text: verdict, then per model what changed and why (each side's explanation)."""
    lines = [
        f"planner gate: {report.plans_compared} plans re-run with {report.current_version}; expected plans "
        f"made with {report.expected_version}; {len(report.changes)} differ"
    ]
    Seen = dict[tuple[str, str, str], list[tuple[int, Difference]]]  # (kind, key, change) -> where
    by_model: dict[str, Seen] = defaultdict(lambda: defaultdict(list))
    others: dict[str, list[int]] = defaultdict(list)
    rescored: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for change in report.changes:
        for model, what in change.rescored:
            rescored[model].append((change.plan_seq, what))
        for d in change.differences:
            by_model[d.model_id][(d.kind, d.key, describe(d) if d.change == "changed" else d.change)].append(
                (change.plan_seq, d))
        for name in change.other_fields:
            others[name].append(change.plan_seq)
    for model in sorted(by_model):
        groups = by_model[model]
        seqs = sorted({s for items in groups.values() for s, _ in items})
        lines.append(f"  {model}: decisions differ in {_span(seqs)}")
        ordered = sorted(groups.items(), key=lambda kv: (kv[1][0][0], kv[0]))
        for (kind, key, what), items in ordered[:per_model]:
            first_seq, d = items[0]
            lines.append(f"    {kind} {key} {what} ({_span([s for s, _ in items])})")
            lines.append(f"      expected: {d.recorded_explanation or '-'}")
            lines.append(f"      now:      {d.replayed_explanation or '-'}")
        if len(ordered) > per_model:
            lines.append(f"    ... {len(ordered) - per_model} more kinds of difference")
    for model in sorted(set(rescored) - set(by_model)):
        seqs = sorted({seq for seq, _ in rescored[model]})
        lines.append(f"  {model}: same decisions, scores or reasons differ in {_span(seqs)}")
        lines.append(f"    e.g. plan {rescored[model][0][0]}: {rescored[model][0][1]}")
    for name in sorted(others):
        lines.append(f"  plan field {name} differs in {_span(sorted(others[name]))}")
    lines.extend(f"  {note}" for note in report.notes)
    if VERSION_NOT_REGENERATED in report.failures:
        lines.append(f"FAIL: the planner version is {report.current_version} but the expected plans were made "
                     f"with {report.expected_version}: regenerate them with `{REGENERATE_COMMAND}`")
    elif PLANS_DIFFER in report.failures:
        what = "decisions" if by_model else "plans (no placement decision; scores, reasons or explanations)"
        lines.append(f"FAIL: the planner changed {what} on the recorded log: if that is intended, raise "
                     f"PLANNER_VERSION (grid/planner/plan.py) and run `{REGENERATE_COMMAND}`")
    elif report.failures:
        lines.append(f"FAIL: {', '.join(report.failures)}: run `{REGENERATE_COMMAND}`")
    else:
        lines.append("PASS: every plan is the expected one")
    return lines


# --- regeneration -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Regeneration:
    written: bool
    report: GateReport
    reason: str = ""


def regenerate(corpus: Path, rerun: Rerun) -> Regeneration:
    """Write `rerun` as the corpus's expected plans, unless plans changed under the same version."""
    try:
        expected: Expected | None = load_expected(corpus)
    except GateError:
        expected = None  # a new corpus
    if expected is None or expected.manifest.events_sha256 != rerun.events_sha256:
        # A new recording: the old expected plans say nothing about it.
        report = GateReport(expected.manifest.planner_version if expected else "(none)", rerun.planner_version,
                            len(rerun.plans))
        report.notes.append(f"new export ({EVENTS_FILE} sha256 {rerun.events_sha256[:12]}): "
                            f"{len(rerun.plans)} expected plans")
        write_expected(corpus, rerun)
        return Regeneration(True, report)
    report = compare(expected, rerun)
    same_version = rerun.planner_version == expected.manifest.planner_version
    if report.changes and same_version:
        report.failures.append(REGENERATION_NEEDS_VERSION)
        return Regeneration(False, report, f"plans changed but PLANNER_VERSION is still {rerun.planner_version}: "
                                           "raise it (grid/planner/plan.py) first")
    write_expected(corpus, rerun)
    return Regeneration(True, report)


def recorded_agreement(rerun: Rerun) -> str:
    """How many re-run plans equal the plans recorded in the export (the live planner's)."""
    s = rerun.replay.summary
    return (f"{s.identical} of {s.plans_compared} plans equal the recorded ones byte for byte; "
            f"{s.differing} differ in decisions, {s.digest_mismatches} rebuilt inputs differ from the recorded")


# --- command line -------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m replay.gate",
        description="Replay the planner corpus with the current planner and compare with its expected plans.",
    )
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS,
                        help=f"Corpus directory ({EVENTS_FILE}, {EXPECTED_PLANS_FILE}, {MANIFEST_FILE}); "
                             "default tests/golden/planner_corpus.")
    parser.add_argument("--planner", default=None,
                        help="Planner to run, as module:function or file.py:function (default the installed one).")
    parser.add_argument("--regenerate", action="store_true",
                        help="Rewrite the expected plans from this planner (refused while plans differ under the "
                             "same PLANNER_VERSION) and print the summary for the commit message.")
    parser.add_argument("--json", action="store_true",
                        help="Print the report as JSON (verdict, failures, every changed plan) instead of text.")
    args = parser.parse_args(argv)
    try:
        rerun = asyncio.run(rerun_corpus(args.corpus, args.planner))
    except (GateError, PlannerPathError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for warning in rerun.replay.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if not args.regenerate:
        try:
            report = compare(load_expected(args.corpus), rerun)
        except GateError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if args.json:
            out = {**msgspec.to_builtins(report), "passed": report.passed}
            sys.stdout.write(msgspec.json.format(msgspec.json.encode(out), indent=2).decode() + "\n")
        else:
            print("\n".join(summary_lines(report)))
        return EXIT_PASSED if report.passed else EXIT_FAILED
    outcome = regenerate(args.corpus, rerun)
    if not outcome.written:
        print("\n".join(summary_lines(outcome.report)[:-1]))
        print(f"REFUSED: {outcome.reason}")
        return EXIT_FAILED
    report = outcome.report
    print(f"Regenerate the planner corpus's expected plans ({report.expected_version} -> {report.current_version})")
    print()
    print("\n".join(summary_lines(report)[:-1]))
    print(f"  {recorded_agreement(rerun)}")
    print(f"wrote {args.corpus / EXPECTED_PLANS_FILE} and {args.corpus / MANIFEST_FILE}")
    return EXIT_PASSED


if __name__ == "__main__":
    sys.exit(main())
