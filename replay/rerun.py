"""Re-run recorded plans: fold the log exactly as the controller did, plan again, compare.

For every recorded plan (PlanCreated) in order, the projections are advanced to the plan's
``based_on`` positions; the planner input is rebuilt from those states by the controller's own
tick composition (grid.controller.tick) with the plan's recorded ``now`` and ``policy``; its digest is checked against the recorded ``inputs_digest``; the chosen planner runs and its
encoded plan is compared with the recorded bytes. Folding stops at each plan's positions (the
controller catches up to the log's end before each tick), so folds that read other
projections see the same cross-stream prefix the controller saw.

Folding is strict: a malformed event raises ``ReplayError`` naming its stream and sequence. An
unknown ``--planner`` path raises ``PlannerPathError`` naming the path, before anything is read.
An event the live folds reject (not provably written by an identity that may write its subject,
signed by a key revoked earlier in the log, or not vouched for by its subject) is not an error:
it is skipped exactly as the controller skipped it, verified with the source's authorship
(``Source.authorship``), and listed in the result's ``rejections`` (stream, seq, subject, reason,
signer role) with counts by reason. A rejected recorded plan is listed and not re-run.
A digest mismatch is explained where it can be (``replay.diagnose``: plans recorded before the
controller read ``based_on`` together with the input). The result is a value; writing it to
DuckDB is ``replay.store``'s job.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import math
import os
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from grid.controller.tick import PROJECTIONS, recorded_policy, tick_input
from grid.events import codec
from grid.events.authorship import AuthorshipGate, Rejection, Signed, describe_rejected
from grid.events.codec import EventDecodeError
from grid.events.plan import PlanCreated
from grid.events.subjects import PLANS_STREAM
from grid.fleet import planning
from grid.fleet.planning import Plan, PlannerInput
from grid.identity.provenance import SUBJECT_MISMATCH, vouched_for
from grid.planner.digest import inputs_digest
from grid.projections.runner import (
    STREAM_ORDER,
    ProjectionRunner,
    ProjectionSpec,
    ReplayError,
    merge_by_receipt_time,
)
from replay.diagnose import BasedOnDrift, InputBuilder, drift_warning
from replay.diff import Difference, diff_plans
from replay.extract import Source, StreamReader, Window, read_range

DEFAULT_PLANNER = "grid.planner.plan:plan"

STATUS_IDENTICAL = "identical"  # the re-run's encoded plan equals the recorded bytes
STATUS_EQUIVALENT = "equivalent"  # same placements, preemptions and shortfalls; other bytes differ
STATUS_DIFFERING = "differing"  # at least one decision differs

ENCODING_PLANNER = "encode_plan"
ENCODING_DECLARATION = "msgspec-declaration-order"


class PlannerPathError(ValueError):
    """A --planner path that does not name an importable callable."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"planner {path!r}: {reason}")
        self.path = path
        self.reason = reason


# --- the planner under test -------------------------------------------------------------------


@dataclass(frozen=True)
class PlannerRef:
    path: str
    func: Callable[[PlannerInput], Any]
    version: str | None
    encode: Callable[[Any], bytes]


def encode_plan(plan: Any) -> bytes:
    """Encode a plan the way the controller records it (the planner's encode_plan)."""
    if isinstance(plan, (bytes, bytearray, memoryview)):
        return bytes(plan)
    return planning.encode_plan(plan)


def decode_plan(data: bytes) -> Plan:
    return planning.decode_plan(data)


def _import_path(path: str, module_part: str) -> Any:
    if module_part.endswith(".py") or "/" in module_part:
        file = Path(module_part)
        if not file.is_file():
            raise PlannerPathError(path, f"file {module_part} does not exist")
        name = f"_grid_replay_planner_{hashlib.sha256(str(file.resolve()).encode()).hexdigest()[:12]}"
        spec = importlib.util.spec_from_file_location(name, file)
        if spec is None or spec.loader is None:
            raise PlannerPathError(path, f"cannot load {module_part} as a module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise PlannerPathError(path, f"importing {module_part} failed: {exc!r}") from exc
        return module
    # Like `python -m` and uvicorn: a planner module in the working directory is importable.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    try:
        return importlib.import_module(module_part)
    except ModuleNotFoundError as exc:
        if exc.name and (module_part == exc.name or module_part.startswith(exc.name + ".")):
            raise PlannerPathError(path, f"no module named {exc.name!r}") from exc
        raise PlannerPathError(path, f"importing {module_part} failed: {exc}") from exc
    except Exception as exc:
        raise PlannerPathError(path, f"importing {module_part} failed: {exc!r}") from exc


def load_planner(path: str | None = None) -> PlannerRef:
    """Resolve ``module:function`` (or ``file.py:function``); default the planner the controller runs."""
    path = (path or DEFAULT_PLANNER).strip()
    module_part, sep, attr = path.rpartition(":")
    if not sep or not module_part or not attr:
        raise PlannerPathError(path, "expected module:function (e.g. grid.planner.plan:plan)")
    module = _import_path(path, module_part)
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PlannerPathError(path, f"module {module_part} has no attribute {attr!r}") from None
    if not callable(obj):
        raise PlannerPathError(path, f"{attr} in {module_part} is not callable")
    version = getattr(module, "PLANNER_VERSION", None)
    encoder = getattr(module, "encode_plan", None)
    return PlannerRef(path, obj, None if version is None else str(version), encoder or encode_plan)


# --- the controller's view --------------------------------------------------------------------


def controller_input(states: Mapping[str, Any], plan: PlanCreated) -> PlannerInput:
    """The planner input the controller built for `plan`: its tick at the recorded now and policy."""
    return tick_input(states, plan.now, recorded_policy(plan)).planner_input


# --- results ----------------------------------------------------------------------------------


class PlanOutcome(msgspec.Struct, frozen=True, kw_only=True):
    plan_seq: int
    time: float
    generation: str
    recorded_version: str
    replayed_version: str
    recorded_digest: str
    replayed_digest: str
    digest_match: bool
    status: str
    differences: tuple[Difference, ...] = ()
    plan_seconds: float = 0.0
    # How the recorded bytes were reproduced: the planner's encode_plan, or msgspec declaration order.
    encoding: str = "encode_plan"
    # When the digest at based_on differs: the earlier positions whose rebuilt input has exactly
    # the recorded digest (the recorder's based_on ran ahead of its input), if found.
    input_positions: dict[str, int] | None = None
    diagnosis: str = ""


class Summary(msgspec.Struct, frozen=True, kw_only=True):
    plans_compared: int
    identical: int
    equivalent: int
    differing: int
    digest_mismatches: int
    # Digest mismatches explained by a based_on ahead of the recorded input (see PlanOutcome).
    based_on_drift: int = 0


class ReplayResult(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    source: str
    source_detail: str
    window: Window
    planner: str
    planner_version: str | None
    fold_order: str
    started_at: float
    finished_at: float
    events_folded: int
    plans: tuple[PlanOutcome, ...]
    summary: Summary
    warnings: tuple[str, ...] = ()
    # Events skipped as the live folds skip them (authorship not proven, or not vouched for by
    # their subject): counts by reason, and each one in stream order.
    rejected: dict[str, int] = {}
    rejections: tuple[Rejection, ...] = ()

    @property
    def reproduced(self) -> bool:
        """Every compared plan reproduced byte for byte from matching inputs."""
        return self.summary.identical == self.summary.plans_compared and self.summary.digest_mismatches == 0


def summarise(plans: Sequence[PlanOutcome]) -> Summary:
    return Summary(
        plans_compared=len(plans),
        identical=sum(p.status == STATUS_IDENTICAL for p in plans),
        equivalent=sum(p.status == STATUS_EQUIVALENT for p in plans),
        differing=sum(p.status == STATUS_DIFFERING for p in plans),
        digest_mismatches=sum(not p.digest_match for p in plans),
        based_on_drift=sum(p.input_positions is not None for p in plans),
    )


class Progress:
    """Callbacks a caller (the CLI's progress bar) may pass; every method is optional."""

    def start(self, events_total: int, plans_total: int) -> None:  # pragma: no cover - interface
        pass

    def advance(self, events: int = 0, plans: int = 0) -> None:  # pragma: no cover - interface
        pass


# --- the replay -------------------------------------------------------------------------------


def _decode_plan_event(msg: Any) -> PlanCreated:
    try:
        event = codec.decode(msg.data)
    except EventDecodeError as exc:
        raise ReplayError(msg.stream, msg.seq, exc.reason) from exc
    if not isinstance(event, PlanCreated):
        raise ReplayError(msg.stream, msg.seq, f"expected a plan, found {type(event).__name__}")
    return event


FOLD_TIME = "time"
FOLD_STREAM = "stream"
FOLD_ORDERS: tuple[str, ...] = (FOLD_TIME, FOLD_STREAM)


class _Folder:
    """A strict runner plus one forward-only reader per stream it folds.

    ``time`` order merges the streams by receipt time (ties in catch-up stream order): the
    interleaving a live controller's followers see. ``stream`` order folds each stream in turn
    (the runner's catch-up order): what a controller that caught up just before planning saw.
    The two differ only for folds that read another projection (demand reads the catalog).
    """

    def __init__(self, source: Source, specs: Sequence[ProjectionSpec], bounds: Mapping[str, tuple[int, int]],
                 progress: Progress | None, order: str = FOLD_TIME) -> None:
        self.source = source
        # Judges authorship as the live folds did (None: the source verifies nothing).
        self.runner = ProjectionRunner(specs, strict=True, authorship=getattr(source, "authorship", None))
        self.bounds = bounds
        self.readers: dict[str, StreamReader] = {}
        self.progress = progress
        self.order = order
        self.folded = 0

    async def _pending(self, based_on: Mapping[str, int], plan_seq: int) -> list[tuple[str, int]]:
        runner = self.runner
        out: list[tuple[str, int]] = []
        for stream in runner.streams:
            # A stream the controller had not folded anything from is absent (position 0).
            target = based_on.get(stream, 0)
            last = self.bounds.get(stream, (0, 0))[1]
            if target > last:
                raise ReplayError(
                    stream, last + 1,
                    f"{self.source.kind} source ends at sequence {last}, but plan {plan_seq} was based on {target}",
                )
            if target <= runner.positions.get(stream, 0):
                continue
            if stream not in self.readers:
                self.readers[stream] = await self.source.reader(stream, runner.positions.get(stream, 0) + 1)
            out.append((stream, target))
        return out

    def _count(self, n: int) -> None:
        self.folded += n
        if self.progress is not None and n:
            self.progress.advance(events=n)

    async def advance(self, based_on: Mapping[str, int], plan_seq: int,
                      sink: Callable[[Any], Any] | None = None) -> None:
        """Fold every stream up to `based_on` (or hand the messages to `sink` instead, in order)."""
        pending = await self._pending(based_on, plan_seq)
        fold = self.runner.fold if sink is None else sink
        if self.order == FOLD_STREAM or len(pending) <= 1:
            for stream, target in pending:
                n = 0
                async for msg in self.readers[stream].take(target):
                    fold(msg)
                    n += 1
                    if n % 4096 == 0:
                        self._count(4096)
                self._count(n % 4096)
            return
        # Receipt-time merge of every stream with something to fold (a k-way heap merge).
        # The same receipt-time merge as the controller's catch-up.
        iters = {stream: self.readers[stream].take(target).__aiter__() for stream, target in pending}
        n = 0
        async for msg in merge_by_receipt_time(iters):
            fold(msg)
            n += 1
            if n % 4096 == 0:
                self._count(4096)
        self._count(n % 4096)

    def behind(self, based_on: Mapping[str, int]) -> str | None:
        for stream in self.runner.streams:
            if based_on.get(stream, 0) < self.runner.positions.get(stream, 0):
                return stream
        return None

    async def close(self) -> None:
        for reader in self.readers.values():
            await reader.close()
        self.readers.clear()


class _Rejected:
    """The rejections of every folder a replay used, each position once (a folder rebuilt from
    the stream start meets the same rejections again)."""

    def __init__(self) -> None:
        self.by_position: dict[tuple[str, int], Rejection] = {}
        # Per reason, the most any one gate counted (its list keeps only the first few hundred).
        self.floor: dict[str, int] = {}

    def take(self, gate: AuthorshipGate) -> None:
        for rejection in gate.rejections:
            self.by_position.setdefault((rejection.stream, rejection.seq), rejection)
        for reason, n in gate.rejected.items():
            self.floor[reason] = max(self.floor.get(reason, 0), n)

    def add(self, rejection: Rejection) -> None:
        self.by_position.setdefault((rejection.stream, rejection.seq), rejection)

    def result(self) -> tuple[dict[str, int], tuple[Rejection, ...]]:
        rank = {stream: i for i, stream in enumerate(STREAM_ORDER)}
        listed = tuple(sorted(self.by_position.values(), key=lambda r: (rank.get(r.stream, len(rank)), r.stream, r.seq)))
        counts: dict[str, int] = {}
        for r in listed:
            counts[r.reason] = counts.get(r.reason, 0) + 1
        for reason, n in self.floor.items():
            counts[reason] = max(counts.get(reason, 0), n)
        return dict(sorted(counts.items())), listed


def _plan_rejection(folder: _Folder, msg: Any) -> Rejection | None:
    """Why a recorded plan is not the controller's (as the live plans fold judges it), or None."""
    gate = folder.runner.gate
    verdict = Signed()
    if gate.authorship is not None:
        verdict = gate.authorship.verify(msg.subject, msg.data, msg.headers, at=msg.time, revoked=gate.revoked)
    if verdict.ok:
        try:
            event = codec.decode(msg.data)
        except EventDecodeError:
            return None  # malformed: _decode_plan_event names it
        if vouched_for(msg, event):
            return None
        verdict = Signed(reason=SUBJECT_MISMATCH, signer=verdict.signer, role=verdict.role)
    return Rejection(msg.stream, msg.seq, msg.subject, verdict.reason, verdict.signer, verdict.role)


async def _window_plan_range(source: Source, window: Window, first: int, last: int) -> tuple[int, int]:
    lo, hi = first, last
    if window.start_seq is not None:
        lo = max(lo, window.start_seq)
    if window.end_seq is not None:
        hi = min(hi, window.end_seq)
    if window.start_time is not None:
        at = await source.first_seq_at(PLANS_STREAM, window.start_time)
        lo = max(lo, at if at is not None else last + 1)
    if window.end_time is not None:
        after = await source.first_seq_at(PLANS_STREAM, math.nextafter(window.end_time, math.inf))
        if after is not None:
            hi = min(hi, after - 1)
    return lo, hi


async def replay_window(
    source: Source,
    window: Window = Window(),
    *,
    planner: PlannerRef | str | None = None,
    specs: Sequence[ProjectionSpec] = PROJECTIONS,
    build_input: InputBuilder = controller_input,
    digest: Callable[[PlannerInput], str] = inputs_digest,
    progress: Progress | None = None,
    run_id: str | None = None,
    fold_order: str = FOLD_TIME,
    diagnose: bool = True,
) -> ReplayResult:
    """Re-run every recorded plan of `window` (plans-stream receipt time / sequence) from `source`."""
    started = time.time()
    ref = planner if isinstance(planner, PlannerRef) else load_planner(planner)
    warnings: list[str] = []

    probe = ProjectionRunner(specs)
    streams = tuple(dict.fromkeys((*probe.streams, PLANS_STREAM)))
    bounds = {s: await source.bounds(s) for s in streams}
    for stream in probe.streams:
        first = bounds[stream][0]
        if first > 1:
            warnings.append(
                f"{stream}: {source.kind} source starts at sequence {first}; state from earlier events is missing"
            )
    plans_first, plans_last = bounds[PLANS_STREAM]
    outcomes: list[PlanOutcome] = []
    if fold_order not in FOLD_ORDERS:
        raise ValueError(f"fold order {fold_order!r} is not one of {', '.join(FOLD_ORDERS)}")
    folder = _Folder(source, specs, bounds, progress, fold_order)
    if plans_last == 0:
        warnings.append("the source holds no recorded plans")
        lo, hi = 1, 0
    else:
        lo, hi = await _window_plan_range(source, window, plans_first, plans_last)
    if progress is not None:
        events_total = 0
        if hi >= lo:
            tail = await read_range(source, PLANS_STREAM, hi, hi)
            if tail:
                try:
                    based_on = _decode_plan_event(tail[-1]).based_on
                    events_total = sum(max(0, based_on.get(s, 0) - bounds[s][0] + 1)
                                       for s in probe.streams if bounds[s][0])
                except ReplayError:
                    pass  # reported with its sequence when the main pass reaches it
        progress.start(events_total, max(0, hi - lo + 1))
    plans_reader = await source.reader(PLANS_STREAM, 1)
    # Digest mismatches of plans recorded before based_on was read with the input (replay.diagnose).
    drift = BasedOnDrift(lambda: _Folder(source, specs, bounds, None, fold_order), source, build_input, digest,
                         enabled=diagnose)
    rejected = _Rejected()
    try:
        if hi >= lo:
            async for msg in plans_reader.take(hi):
                refused = _plan_rejection(folder, msg)
                if refused is not None:
                    # Not the controller's plan: the live folds skipped it, so is it here.
                    rejected.add(refused)
                    if window.past(msg.seq, msg.time):
                        break
                    continue
                event = _decode_plan_event(msg)
                if window.past(msg.seq, msg.time):
                    break
                behind = folder.behind(event.based_on)
                if behind is not None:
                    warnings.append(
                        f"plan {msg.seq} is based on an earlier {behind} position than the plan before it; "
                        "state was rebuilt from the stream start"
                    )
                    await folder.close()
                    rejected.take(folder.runner.gate)
                    folded = folder.folded
                    folder = _Folder(source, specs, bounds, progress, fold_order)
                    folder.folded = folded
                    drift.restart()
                await drift.advance(folder, event.based_on, msg.seq)
                if msg.seq < lo or not window.contains(msg.seq, msg.time):
                    continue
                planner_input = build_input(folder.runner.states, event)
                at_based_on = digest(planner_input)
                finding = await drift.explain(event, msg.seq, at_based_on)
                rerun_input = planner_input if finding.planner_input is None else finding.planner_input
                outcome = _compare(ref, rerun_input, at_based_on, msg.seq, msg.time, event)
                if finding.diagnosis:
                    outcome = msgspec.structs.replace(outcome, input_positions=finding.input_positions,
                                                      diagnosis=finding.diagnosis)
                outcomes.append(outcome)
                if progress is not None:
                    progress.advance(plans=1)
    finally:
        await plans_reader.close()
        await folder.close()
    rejected.take(folder.runner.gate)
    rejected_counts, rejections = rejected.result()
    warnings.extend(source.warnings)
    if rejections:
        warnings.append(
            f"{describe_rejected(rejected_counts)} (not provably written by an identity that may write "
            "their subject): skipped, as the live folds skip them"
        )
    plans = tuple(outcomes)
    odd = [p.plan_seq for p in plans if p.status == STATUS_IDENTICAL and p.encoding != ENCODING_PLANNER]
    if odd:
        warnings.append(
            f"{len(odd)} recorded plan(s) (first: sequence {odd[0]}) were encoded with msgspec.json.encode, "
            "not the planner's encode_plan; reproduced byte for byte with that encoding"
        )
    drifted = drift_warning(plans)
    if drifted is not None:
        warnings.append(drifted)
    return ReplayResult(
        run_id=run_id or uuid.uuid4().hex,
        source=source.kind,
        source_detail=source.description,
        window=window,
        planner=ref.path,
        planner_version=ref.version,
        fold_order=fold_order,
        started_at=started,
        finished_at=time.time(),
        events_folded=folder.folded,
        plans=plans,
        summary=summarise(plans),
        warnings=tuple(warnings),
        rejected=rejected_counts,
        rejections=rejections,
    )


def _compare(ref: PlannerRef, planner_input: PlannerInput, replayed_digest: str, seq: int, at: float,
             event: PlanCreated) -> PlanOutcome:
    t0 = time.perf_counter()
    try:
        result = ref.func(planner_input)
    except Exception as exc:
        raise ReplayError(PLANS_STREAM, seq, f"planner {ref.path} raised {exc!r}") from exc
    seconds = time.perf_counter() - t0
    replayed_bytes = ref.encode(result)
    recorded_bytes = bytes(event.plan)
    if isinstance(result, (bytes, bytearray, memoryview)):
        result = decode_plan(bytes(result))
    replayed_version = getattr(result, "planner_version", None) or ref.version or ""
    encoding = ENCODING_PLANNER
    if replayed_bytes != recorded_bytes and not isinstance(result, bytes):
        # A recorder that wrote msgspec's declaration-order JSON instead of the planner's
        # encode_plan is still reproduced byte for byte by that (equally deterministic) encoding.
        if msgspec.json.encode(result) == recorded_bytes:
            replayed_bytes, encoding = recorded_bytes, ENCODING_DECLARATION
    if replayed_bytes == recorded_bytes:
        status, differences = STATUS_IDENTICAL, ()
    else:
        try:
            recorded_plan = decode_plan(recorded_bytes)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ReplayError(PLANS_STREAM, seq, f"recorded plan does not decode: {exc}") from exc
        differences = tuple(diff_plans(recorded_plan, result))
        status = STATUS_DIFFERING if differences else STATUS_EQUIVALENT
    return PlanOutcome(
        plan_seq=seq,
        time=at,
        generation=event.generation,
        recorded_version=event.planner_version,
        replayed_version=replayed_version,
        recorded_digest=event.inputs_digest,
        replayed_digest=replayed_digest,
        digest_match=replayed_digest == event.inputs_digest,
        status=status,
        differences=differences,
        plan_seconds=seconds,
        encoding=encoding,
    )


__all__ = [
    "DEFAULT_PLANNER",
    "InputBuilder",
    "PlanOutcome",
    "PlannerPathError",
    "PlannerRef",
    "Progress",
    "ReplayResult",
    "STREAM_ORDER",
    "Summary",
    "controller_input",
    "decode_plan",
    "encode_plan",
    "inputs_digest",
    "load_planner",
    "replay_window",
    "summarise",
]
