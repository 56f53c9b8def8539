"""Each field of a model profile, declared once: what it means, how gridctl spells it, and what the
admin API holds it to beyond its type.

The type and the bounds every reader enforces are ModelProfile's own (grid.events.control); this
table adds what the edges need, keyed by the same names. gridctl's `model set` options
(grid.cli.profile_options), the admin API's bodies and checks (grid.controller.admin_input) and so
its OpenAPI document are derived from ModelProfile and this table, so a new field is a line
in each of the two, and a field in one but not the other fails at import of the admin API
(`field`) and in tests/unit/controller/test_profile_fields.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from grid.events.control import DATA_TIERS

# --- bounds of what a profile body may hold (beyond the event's own, grid.events.control) ------
# The event decoder keeps only ModelProfile's bounds, so profiles already on the log still fold;
# the admin API adds these to what it accepts.
# A list item of a profile names a runtime, a backend, a tag, a host or a model; the longest of
# these is a host id (grid.events.control.HostId, 256 characters). An operator probing by hand
# stored 10 KB strings here: each is copied into every plan and status that mentions the model.
MAX_NAME_LENGTH = 256
# A workload name keys workload_scores; the same bound as an evaluation's workload
# (grid.controller.evaluations.EvaluationBody), the other way a workload enters the catalog.
MAX_WORKLOAD_NAME_LENGTH = 64
# Items in one list (or entries in one map) of a profile: more than any fleet's hosts the planner
# would weigh for one model (MAX_REPLICAS is 4096 replicas; pins and allow lists name hosts).
MAX_PROFILE_ITEMS = 1024
# The longest artifact_source URI: the common 2 KB URL bound of HTTP servers and proxies.
MAX_SOURCE_LENGTH = 2048


@dataclass(frozen=True)
class Range:
    """A number's bounds at the admin API beyond its type's (a type allows 0 replicas of
    concurrency; a profile does not). Refused as "must be > 0", "must be <= 1.0" and so on, with
    `note` after it in parentheses, or always as `says` when given. None is never checked."""

    gt: float | None = None
    ge: float | None = None
    le: float | None = None
    note: str = ""
    says: str = ""


@dataclass(frozen=True)
class ProfileField:
    name: str
    # What the field means, as gridctl's help says it (gridctl adds "(repeat)" to a list or a map,
    # and the default a new profile takes).
    help: str
    # gridctl's option; by default --name with dashes. A list's or a map's is singular (repeated).
    option: str = ""
    # The admin API's bound on the field's text: a scalar string, or each list item or map key
    # (lists and maps: MAX_NAME_LENGTH unless given).
    max_length: int | None = None
    # A number's bounds, or each map value's.
    range: Range | None = None
    # The values a string may take.
    choices: tuple[str, ...] = ()
    # What each list item or map key names: a blank one is refused ("runtime names must not be
    # empty"). With `required`, the list may not be empty either ("at least one runtime is required").
    names: str = ""
    required: bool = False

    @property
    def cli_option(self) -> str:
        return self.option or "--" + self.name.replace("_", "-")


_SECONDS = Range(ge=0.0)

# In gridctl's help order; the admin API checks the fields in this order too.
PROFILE_FIELDS: tuple[ProfileField, ...] = (
    ProfileField("memory_mb", "Resident runtime budget of one replica, MiB",
                 range=Range(gt=0, note="resident runtime budget of one replica, MB")),
    ProfileField("runtimes", "Eligible runtime", option="--runtime", names="runtime", required=True),
    ProfileField("runtime_memory_mb", "RUNTIME=MiB: budget on that runtime", names="runtime", range=Range(gt=0)),
    ProfileField("backends", "Eligible backend, e.g. cuda", option="--backend"),
    ProfileField("artifact_sha256", "Immutable artifact digest"),
    ProfileField("artifact_source", "Exact source (hf://owner/repo/path.gguf); needs sha256 and size",
                 max_length=MAX_SOURCE_LENGTH),
    ProfileField("artifact_size_mb", "Transfer size ceiling, MiB", range=Range(gt=0)),
    ProfileField("min_replicas", "Replicas kept even without demand", range=Range(ge=0)),
    ProfileField("max_replicas", "Most replicas demand may ask for", range=Range(ge=0)),
    ProfileField("priority", "Higher wins placement and may preempt lower"),
    ProfileField("data_tier", " | ".join(DATA_TIERS), choices=DATA_TIERS),
    ProfileField("required_tags", "Host tag the model needs", option="--required-tag"),
    ProfileField("forbidden_tags", "Host tag the model avoids", option="--forbidden-tag"),
    ProfileField("allow_hosts", "Only these hosts", option="--allow-host"),
    ProfileField("deny_hosts", "Never these hosts", option="--deny-host"),
    ProfileField("pins", "Host id the model is pinned to", option="--pin"),
    ProfileField("min_failure_domains", "Spread replicas over at least this many domains", range=Range(ge=1)),
    ProfileField("max_colocated_models", "Most models beside it on one host, 0 = unlimited",
                 range=Range(ge=0, note="0 means unlimited")),
    ProfileField("colocation_excludes", "Model never placed on the same host", option="--colocation-exclude"),
    ProfileField("workload_scores", "WORKLOAD=SCORE in (0, 1]", option="--workload-score", names="workload",
                 max_length=MAX_WORKLOAD_NAME_LENGTH, range=Range(gt=0, le=1, says="score must be in (0, 1]")),
    ProfileField("target_utilization", "Busy fraction a replica is sized for, (0, 1]", range=Range(gt=0.0, le=1.0)),
    ProfileField("expected_service_seconds", "Seconds one request takes before evidence", range=Range(gt=0.0)),
    ProfileField("latency_slo_ms", "Latency objective, ms", range=Range(gt=0.0)),
    ProfileField("replica_concurrency", "Requests one replica serves at once (slots)", range=Range(ge=1)),
    ProfileField("load_seconds", "Seconds a cold load takes", range=_SECONDS),
    ProfileField("warm_seconds", "Seconds a warm start takes", range=_SECONDS),
    ProfileField("min_residency_seconds", "Keep a load at least this long", range=_SECONDS),
    ProfileField("scale_down_cooldown_seconds", "Wait this long after demand falls before scaling down",
                 range=_SECONDS),
    ProfileField("min_gpu_count", "GPUs a host must have", range=Range(ge=0)),
    ProfileField("min_gpu_memory_mb", "GPU memory a host must have, MiB", range=Range(ge=0)),
    ProfileField("context_size", "Context window in tokens", range=Range(gt=0)),
    ProfileField("embeddings", "The engine also serves /v1/embeddings"),
    ProfileField("require_qualified", "Place only on hosts whose latest `gridctl qualify` of the runtime for this "
                                      "model (and its artifact_sha256, when set) passed"),
)

FIELDS: dict[str, ProfileField] = {f.name: f for f in PROFILE_FIELDS}


def field(name: str) -> ProfileField:
    """The declaration of ModelProfile field `name`; a field without one is a mistake to catch at
    import, not a profile field gridctl cannot set or the admin API does not check."""
    try:
        return FIELDS[name]
    except KeyError:
        raise LookupError(f"ModelProfile.{name} has no declaration in grid.events.profile_fields.PROFILE_FIELDS") \
            from None


def plain(tp: Any) -> Any:
    """Type `tp` without its Annotated bounds and without None: what a bounded, optional field
    holds when it is set (int for `MemoryMb | None`)."""
    while True:
        origin, args = get_origin(tp), get_args(tp)
        if origin is Annotated:
            tp = args[0]
        elif origin in (Union, UnionType) and type(None) in args:
            rest = [a for a in args if a is not type(None)]
            tp = rest[0] if len(rest) == 1 else Union[tuple(rest)]
        else:
            return tp
