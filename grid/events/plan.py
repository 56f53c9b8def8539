"""A recorded plan: enough identity to re-run it exactly during replay."""

from __future__ import annotations

import msgspec

from grid.events.base import Event


class PlanCreated(Event, frozen=True, kw_only=True, tag="plan.created.v1"):
    planner_version: str
    # "<epoch>:<sequence>:<inputs_digest>", ordered across wall-clock changes.
    generation: str
    epoch: str
    sequence: int
    inputs_digest: str
    # Stream name -> last stream sequence the projections had folded.
    based_on: dict[str, int]
    # The explicit `now` the planner ran with.
    now: float
    controller_id: str = ""
    controller_term: int = 0
    # The planner's Plan, encoded deterministically by grid.planner (opaque to the log).
    plan: msgspec.Raw = msgspec.Raw(b"null")
    # The planner Policy the plan ran under, encoded like `plan` (grid.controller.tick.encode_policy),
    # so replay re-runs a controller with a non-default policy exactly. null: recorded before this
    # field existed, under the default Policy.
    policy: msgspec.Raw = msgspec.Raw(b"null")
    # (host id, model id) of every managed residency whose warm the controller itself commanded
    # and the host acknowledged (grid.projections.placed.corroborated): the gateway routes a
    # managed model only to these. A host's own ack cannot add itself here; this event is the
    # controller's, and signed.
    corroborated: tuple[tuple[str, str], ...] = ()


def make_generation(epoch: str, sequence: int, inputs_digest: str) -> str:
    return f"{epoch}:{sequence:020d}:{inputs_digest}"


def parse_generation(generation: str) -> tuple[str, int, str]:
    epoch, sequence, digest = generation.split(":", 2)
    return epoch, int(sequence), digest
