"""Explain one kind of digest mismatch: a plan whose recorded ``based_on`` ran ahead of its input.

The recorder bug: a controller read its projection positions for a plan's ``based_on`` when it
recorded the plan, not when it built the planner input; the tick awaits in between, so events
folded meanwhile were counted in ``based_on`` although the planner never saw them. Replay then
rebuilds the input at ``based_on`` and finds a digest the recorder never computed. The controller
now reads the positions together with the input (no await in between), so new logs do not show
this; the diagnosis is kept because logs written before that fix are still replayed, and without
it each such plan would read as an unexplained input difference (the planner's nondeterminism
or a fold change) instead of a recorder fault whose plan still reproduces.

What it does: for a plan whose digest at ``based_on`` differs from the recorded one, look for the
positions just before ``based_on`` whose rebuilt input has exactly the recorded digest, so the
plan can be re-run from the input it was really planned from and the outcome names the positions.
The first investigations (``MAX_DIAGNOSES``) re-fold from the stream start; once one finds a
drift, a runner kept one plan behind (the shadow) makes every later one cost one plan's events.
A lossy source (request batches rebuilt from DuckDB rows) may explain a mismatch by itself: there,
one fruitless investigation stops further ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from grid.events.plan import PlanCreated
from grid.fleet.planning import PlannerInput
from grid.projections.runner import ProjectionRunner

# Investigations that re-fold from the stream start (once one finds a drift, a runner kept one plan
# behind makes the later ones cheap), and how many events before based_on each looks at.
MAX_DIAGNOSES = 3
DIAGNOSE_WINDOW = 64

# Positions whose rebuilt input has the recorded digest, and that input.
Found = tuple[dict[str, int], PlannerInput]
# (projection states, the recorded plan) -> the planner input, exactly as the controller builds it.
InputBuilder = Callable[[Mapping[str, Any], PlanCreated], PlannerInput]


class Folder(Protocol):
    """A strict runner folding the source forward to a plan's positions (replay.rerun's folder)."""

    runner: ProjectionRunner

    async def advance(self, based_on: Mapping[str, int], plan_seq: int,
                      sink: Callable[[Any], Any] | None = None) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class Finding:
    """What the diagnosis says about one plan: nothing (empty `diagnosis`) when its digest matched."""

    planner_input: PlannerInput | None = None  # the input rebuilt at `input_positions`, when found
    input_positions: dict[str, int] | None = None
    diagnosis: str = ""


MATCHED = Finding()


class BasedOnDrift:
    """The diagnosis across one replay: call `restart` when the replay rebuilds its state from the
    stream start, `advance` in place of the folder's own advance, and `explain` for every plan
    compared."""

    def __init__(self, new_folder: Callable[[], Folder], source: Any,
                 build_input: InputBuilder,
                 digest: Callable[[PlannerInput], str], *, enabled: bool = True) -> None:
        self._new_folder = new_folder  # a folder from the stream start, reporting no progress
        self._source = source
        self._build_input = build_input
        self._digest = digest
        self.enabled = enabled
        self.diagnosed = 0
        self.fruitless = False
        self._chunks: list[dict[str, int]] = []  # every plan's based_on since the stream start
        self._shadow: ProjectionRunner | None = None
        self._delta: list[Any] = []  # the messages the shadow has still to fold

    def restart(self) -> None:
        self._chunks, self._shadow, self._delta = [], None, []

    async def advance(self, folder: Folder, based_on: Mapping[str, int], plan_seq: int) -> None:
        """Fold `folder` to `based_on`; with a shadow, it catches up to the previous plan's positions
        and this plan's messages are kept for it."""
        if self._shadow is not None:
            for m in self._delta:
                self._shadow.fold(m)
            self._delta = []
            await folder.advance(based_on, plan_seq, sink=_tee(folder.runner, self._delta))
        else:
            await folder.advance(based_on, plan_seq)
        self._chunks.append(dict(based_on))

    async def explain(self, event: PlanCreated, plan_seq: int, digest_at_based_on: str) -> Finding:
        if digest_at_based_on == event.inputs_digest:
            return MATCHED
        found: Found | None = None
        investigated = False
        lossy = bool(getattr(self._source, "lossy_request_batches", 0))
        if self.enabled and not (lossy and self.fruitless):
            if self._shadow is not None:
                investigated = True
                found = _scan(self._shadow, self._delta, event, self._build_input, self._digest, DIAGNOSE_WINDOW)
                self._delta = []
            elif self.diagnosed < MAX_DIAGNOSES:
                self.diagnosed += 1
                investigated = True
                found, runner_at = await _find_input(self._new_folder(), self._chunks, plan_seq, event,
                                                     self._build_input, self._digest)
                if found is not None:
                    self._shadow, self._delta = runner_at, []  # drift recurs: keep a runner one plan behind
            self.fruitless = self.fruitless or found is None
        if found is not None:
            positions, planner_input = found
            moved = {s: f"{event.based_on.get(s, 0)}->{n}" for s, n in sorted(positions.items())
                     if n != event.based_on.get(s, 0)}
            return Finding(
                planner_input=planner_input, input_positions=positions,
                diagnosis=("the recorded digest matches the input rebuilt at earlier positions "
                           + ", ".join(f"{s} {m}" for s, m in moved.items())
                           + ": the recorder's based_on ran ahead of the input it planned from"),
            )
        why = ("the source rebuilt request batches without some feature fields" if lossy else
               f"no input within the last {DIAGNOSE_WINDOW} events before based_on has the recorded digest"
               if investigated else f"not investigated (at most {MAX_DIAGNOSES} per replay)")
        return Finding(diagnosis=why)


def drift_warning(plans: Sequence[Any]) -> str | None:
    """The replay's warning when some of `plans` (PlanOutcome) were diagnosed with drift."""
    drift = [p for p in plans if p.input_positions is not None]
    if not drift:
        return None
    return (f"{len(drift)} plan(s) record a based_on ahead of the input they were planned from (first: sequence "
            f"{drift[0].plan_seq}: {drift[0].diagnosis}); the recorder must capture positions when it builds the input")


def _tee(runner: ProjectionRunner, into: list[Any]) -> Callable[[Any], None]:
    fold = runner.fold
    keep = into.append

    def both(msg: Any) -> None:
        fold(msg)
        keep(msg)

    return both


def _scan(runner: ProjectionRunner, delta: Sequence[Any], event: PlanCreated,
          build_input: InputBuilder,
          digest: Callable[[PlannerInput], str], window: int) -> Found | None:
    """Fold `delta` into `runner`, checking the recorded digest before each of its last `window`
    messages. The runner always ends at the end of `delta`; the first matching prefix is returned."""
    found: Found | None = None
    cut = max(0, len(delta) - window)
    for i, msg in enumerate(delta):
        if found is None and i >= cut:
            candidate = build_input(runner.states, event)
            if digest(candidate) == event.inputs_digest:
                found = (dict(sorted(runner.positions.items())), candidate)
        runner.fold(msg)
    return found


async def _find_input(folder: Folder, chunks: Sequence[Mapping[str, int]], seq: int, event: PlanCreated,
                      build_input: InputBuilder,
                      digest: Callable[[PlannerInput], str],
                      window: int = DIAGNOSE_WINDOW) -> tuple[Found | None, ProjectionRunner]:
    """Look for positions just before `based_on` whose rebuilt input has the recorded digest.

    The fold is repeated from the stream start (`folder` is fresh) chunk by chunk as in the
    replay; the last chunk is scanned message by message. Returns the finding and the runner,
    now at `based_on` (the replay keeps it one plan behind as a shadow, so later investigations
    cost one chunk).
    """
    try:
        for based_on in chunks[:-1]:
            await folder.advance(based_on, seq)
        delta: list[Any] = []
        await folder.advance(chunks[-1], seq, sink=delta.append)
        return _scan(folder.runner, delta, event, build_input, digest, window), folder.runner
    finally:
        await folder.close()


__all__ = ["DIAGNOSE_WINDOW", "MAX_DIAGNOSES", "BasedOnDrift", "Finding", "drift_warning"]
