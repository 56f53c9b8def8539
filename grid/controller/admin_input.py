"""What the admin API accepts: request bodies and query strings, bounded and validated.

Bodies are bounded in size, in time and in how many may be arriving at once (BodyIntake);
profiles are decoded strictly and then checked field by field (validate_profile), so a refusal
names the field at fault and nothing reaches the log. Split from grid.controller.api, which
keeps the routes, so each file has one concern.
"""

from __future__ import annotations

import asyncio
import math
import re
from typing import Annotated, Any, get_args, get_origin

import msgspec
from starlette.requests import Request

from grid.events.artifact_source import SourceError, parse_source
from grid.analytics.history import HistoryParams
from grid.events.control import DATA_TIERS, MODEL_ID_MAX_LENGTH, ModelProfile, model_id_error

MAX_BODY_BYTES = 64 * 1024
# An operator's JSON body arrives in milliseconds; ten seconds is generous on any link.
BODY_TIMEOUT_SECONDS = 10.0
MAX_INCOMPLETE_BODIES = 16
MAX_MODEL_ID_LENGTH = MODEL_ID_MAX_LENGTH  # the grammar is grid.events.control's MODEL_ID_PATTERN
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

# --- bounds of what a profile body may hold (beyond the event's own, grid.events.control) ------
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
# Artifact source schemes the admin API accepts. hf:// and http(s):// name bytes any host may
# fetch (each is then parsed by the agents' grid.events.artifact_source.parse_source). No source at
# all, with artifact_sha256, means the grid's artifact store (what `gridctl pull` publishes).
# file:// is refused: a path names a file on whichever host the command reaches (an agent reads
# one only from directories its host allows, GRID_ARTIFACT_FILE_ROOTS), so it is a way to probe
# hosts' disks, never a portable source; anything unlisted is refused too.
ACCEPTED_SOURCE_SCHEMES: tuple[str, ...] = ("hf", "https", "http")

Name = Annotated[str, msgspec.Meta(max_length=MAX_NAME_LENGTH)]
WorkloadName = Annotated[str, msgspec.Meta(max_length=MAX_WORKLOAD_NAME_LENGTH)]
SourceUri = Annotated[str, msgspec.Meta(max_length=MAX_SOURCE_LENGTH)]


def _bounded(name: str, tp: Any) -> Any:
    """The body's type of profile field `name`: the event's type `tp` with the API's bounds on
    its strings and collections (the event decoder stays as it is, so old events still fold)."""
    if name == "artifact_source":
        return SourceUri | None
    origin, args = get_origin(tp), get_args(tp)
    if origin is tuple and len(args) == 2 and args[0] is str and args[1] is Ellipsis:
        return Annotated[tuple[Name, ...], msgspec.Meta(max_length=MAX_PROFILE_ITEMS)]
    if origin is dict and args and args[0] is str:
        key = WorkloadName if name == "workload_scores" else Name
        return Annotated[dict[key, args[1]], msgspec.Meta(max_length=MAX_PROFILE_ITEMS)]  # type: ignore[valid-type]
    return tp


def _body_struct() -> type:
    """ModelProfile's fields minus model_id, strict about unknown fields (kept in sync), with the
    API's bounds on strings and collections (`_bounded`)."""
    fields = []
    for f in msgspec.structs.fields(ModelProfile):
        if f.name == "model_id":
            continue
        tp = _bounded(f.name, f.type)
        if f.required:
            fields.append((f.name, tp))
        elif f.default_factory is not msgspec.NODEFAULT:
            fields.append((f.name, tp, msgspec.field(default_factory=f.default_factory)))
        else:
            fields.append((f.name, tp, f.default))
    return msgspec.defstruct("ProfileBody", fields, kw_only=True, forbid_unknown_fields=True, frozen=True)


ProfileBody = _body_struct()
profile_decoder = msgspec.json.Decoder(ProfileBody)


def _patch_struct() -> type:
    """ProfileBody with every field optional (UNSET = keep the current value): a partial update."""
    fields = [(f.name, f.type | msgspec.UnsetType, msgspec.UNSET)
              for f in msgspec.structs.fields(ProfileBody)]
    return msgspec.defstruct("ProfilePatch", fields, kw_only=True, forbid_unknown_fields=True, frozen=True)


ProfilePatch = _patch_struct()
patch_decoder = msgspec.json.Decoder(ProfilePatch)


def merge_profile(current: ModelProfile, patch: Any) -> Any:
    """The ProfileBody of `current` with the fields `patch` sets replaced (validated by the caller)."""
    values = {f.name: getattr(current, f.name) for f in msgspec.structs.fields(ProfileBody)}
    for f in msgspec.structs.fields(patch):
        value = getattr(patch, f.name)
        if value is not msgspec.UNSET:
            values[f.name] = value
    return ProfileBody(**values)


class ModeBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    mode: str


class TickBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    reason: str = ""


class ForecastWindowBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    # The length of one demand bucket, seconds (grid.events.control.ForecastWindowSet).
    bucket_seconds: float


class BodyError(Exception):
    def __init__(self, status: int, error: str, detail: str, field: str | None = None) -> None:
        super().__init__(detail)
        self.status, self.error, self.detail, self.field = status, error, detail, field


_FIELD_AT = re.compile(r"at `\$\.?([^`]*)`")
# A map's key: "Expected `str` of length <= 64 - at `key` in `$.workload_scores`".
_FIELD_IN = re.compile(r"in `\$\.?([^`]*)`")
_FIELD_NAMED = re.compile(r"field `([^`]+)`")


def _field_from(message: str) -> str | None:
    """The top-level body field a msgspec error names ("$.runtime_memory_mb['x']" -> runtime_memory_mb)."""
    m = _FIELD_NAMED.search(message)
    if m and "unknown field" in message or m and "missing required" in message:
        return m.group(1)
    m = _FIELD_AT.search(message) or _FIELD_IN.search(message)
    if m:
        path = m.group(1)
        return re.split(r"[.\[]", path, maxsplit=1)[0] or None
    return None


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise BodyError(413, "body_too_large", f"body exceeds {limit} bytes")
        except ValueError:
            raise BodyError(400, "bad_content_length", "Content-Length is not a number") from None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyError(413, "body_too_large", f"body exceeds {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class BodyIntake:
    """Bodies bounded in time and in number: each must arrive within `timeout_seconds` (else 408),
    and while `max_incomplete` requests are still receiving theirs, a request that would have to
    wait too is refused at once (503). Both close the connection (the unread rest of a body would
    be parsed as the next request). Without these, clients that sent half a body and stopped held
    hundreds of admin requests open. A body that arrived with its headers never waits, so it is
    never refused (the gateway's grid.gateway.intake does the same for inference requests).
    """

    def __init__(self, *, timeout_seconds: float, max_incomplete: int) -> None:
        self.timeout_seconds = timeout_seconds
        self.max_incomplete = max_incomplete
        self.incomplete = 0

    async def read(self, request: Request, limit: int) -> bytes:
        full = self.incomplete >= self.max_incomplete
        self.incomplete += 1
        try:
            async with asyncio.timeout(0.0 if full else self.timeout_seconds):
                return await _read_body(request, limit)
        except TimeoutError:
            if full:
                raise BodyError(503, "too_many_incomplete_requests",
                                "too many requests are still sending their bodies; retry shortly") from None
            raise BodyError(408, "request_body_timeout",
                            f"the request body did not arrive within {self.timeout_seconds:g} seconds") from None
        finally:
            self.incomplete -= 1


def decode_body(decoder: msgspec.json.Decoder, data: bytes) -> Any:
    """Decode strictly; the profile's bounds (grid.events.control) are part of its types, so a
    value beyond one is refused here: "Expected `int` <= 16777216 - at `$.memory_mb`"."""
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        field = _field_from(str(exc))
        detail = f"{field}: {exc}" if field else str(exc)
        raise BodyError(422, "validation_error", detail, field) from None
    except msgspec.DecodeError as exc:
        raise BodyError(422, "malformed_json", str(exc), _field_from(str(exc))) from None


def _invalid(field: str, detail: str) -> BodyError:
    return BodyError(422, "validation_error", detail, field)


def validate_model_id(model_id: str) -> None:
    error = model_id_error(model_id)
    if error is not None:
        raise _invalid("model_id", error)


def _finite(field: str, value: float, *, low: float | None = None, low_open: bool = False,
            high: float | None = None) -> None:
    if not math.isfinite(value):
        raise _invalid(field, "must be a finite number")
    if low is not None and (value <= low if low_open else value < low):
        raise _invalid(field, f"must be {'>' if low_open else '>='} {low}")
    if high is not None and value > high:
        raise _invalid(field, f"must be <= {high}")


def _check_source(source: str) -> None:
    """An artifact_source the admin API accepts: an ACCEPTED_SOURCE_SCHEMES URI the agents' own
    parser (grid.events.artifact_source.parse_source) takes, without credentials."""
    accepted = ", ".join(f"{scheme}://" for scheme in ACCEPTED_SOURCE_SCHEMES)
    scheme = source.split("://", 1)[0].lower() if "://" in source else ""
    if scheme == "file":
        raise _invalid("artifact_source", f"file:// sources are refused: a path names a file on whichever host "
                       f"loads the model; use one of {accepted}, or leave artifact_source out to fetch "
                       "artifact_sha256 from the grid's artifact store (gridctl pull publishes it)")
    if scheme not in ACCEPTED_SOURCE_SCHEMES:
        raise _invalid("artifact_source", f"scheme must be one of {accepted}")
    authority = source.split("://", 1)[1].split("/", 1)[0]
    if "@" in authority:
        raise _invalid("artifact_source", "credentials do not belong in the source URI")
    if not source.isprintable():
        raise _invalid("artifact_source", "must not contain control characters or whitespace other than spaces")
    try:
        parse_source(source)
    except (SourceError, ValueError) as exc:
        raise _invalid("artifact_source", str(exc)) from None


def validate_profile(model_id: str, body: Any) -> ModelProfile:
    """Semantic checks beyond types; returns the canonical profile (sha256 lowercased)."""
    validate_model_id(model_id)
    if body.memory_mb <= 0:
        raise _invalid("memory_mb", "must be > 0 (resident runtime budget of one replica, MB)")
    if not body.runtimes:
        raise _invalid("runtimes", "at least one runtime is required")
    for name in body.runtimes:
        if not name.strip():
            raise _invalid("runtimes", "runtime names must not be empty")
    for runtime, mb in sorted(body.runtime_memory_mb.items()):
        if not runtime.strip():
            raise _invalid("runtime_memory_mb", "runtime names must not be empty")
        if mb <= 0:
            raise _invalid("runtime_memory_mb", f"{runtime}: must be > 0")
    sha = body.artifact_sha256
    if sha is not None:
        sha = sha.strip().lower()
        if not _SHA256.match(sha):
            raise _invalid("artifact_sha256", "must be 64 hexadecimal characters")
    if body.artifact_size_mb is not None and body.artifact_size_mb <= 0:
        raise _invalid("artifact_size_mb", "must be > 0")
    source = body.artifact_source
    if source is not None:
        if sha is None:
            raise _invalid("artifact_sha256", "artifact_source requires artifact_sha256")
        if body.artifact_size_mb is None:
            raise _invalid("artifact_size_mb", "artifact_source requires artifact_size_mb")
        _check_source(source)
    if body.min_replicas < 0:
        raise _invalid("min_replicas", "must be >= 0")
    if body.max_replicas < 0:
        raise _invalid("max_replicas", "must be >= 0")
    if body.max_replicas < body.min_replicas:
        raise _invalid("max_replicas", "must be >= min_replicas")
    if body.data_tier not in DATA_TIERS:
        raise _invalid("data_tier", f"must be one of {', '.join(DATA_TIERS)}")
    if body.min_failure_domains < 1:
        raise _invalid("min_failure_domains", "must be >= 1")
    if body.max_colocated_models < 0:
        raise _invalid("max_colocated_models", "must be >= 0 (0 means unlimited)")
    if model_id in body.colocation_excludes:
        raise _invalid("colocation_excludes", "a model cannot exclude itself")
    for workload, score in sorted(body.workload_scores.items()):
        if not workload.strip():
            raise _invalid("workload_scores", "workload names must not be empty")
        if not (math.isfinite(score) and 0.0 < score <= 1.0):
            raise _invalid("workload_scores", f"{workload}: score must be in (0, 1]")
    _finite("target_utilization", body.target_utilization, low=0.0, low_open=True, high=1.0)
    _finite("expected_service_seconds", body.expected_service_seconds, low=0.0, low_open=True)
    if body.latency_slo_ms is not None:
        _finite("latency_slo_ms", body.latency_slo_ms, low=0.0, low_open=True)
    if body.replica_concurrency < 1:
        raise _invalid("replica_concurrency", "must be >= 1")
    for name in ("load_seconds", "warm_seconds", "min_residency_seconds", "scale_down_cooldown_seconds"):
        _finite(name, getattr(body, name), low=0.0)
    if body.min_gpu_count < 0:
        raise _invalid("min_gpu_count", "must be >= 0")
    if body.min_gpu_memory_mb < 0:
        raise _invalid("min_gpu_memory_mb", "must be >= 0")
    if body.context_size <= 0:
        raise _invalid("context_size", "must be > 0")
    values = {f.name: getattr(body, f.name) for f in msgspec.structs.fields(body)}
    values["artifact_sha256"] = sha
    return ModelProfile(model_id=model_id, **values)


_HISTORY_QUERY = {"from": "start", "to": "end", "bucket": "bucket_seconds", "model": "model",
                  "changes_only": "changes_only"}


def history_params(query: Any) -> HistoryParams:
    values: dict[str, Any] = {}
    for key, raw in query.multi_items():
        name = _HISTORY_QUERY.get(key)
        if name is None:
            raise BodyError(422, "validation_error", f"unknown query parameter {key!r}", key)
        if name == "model":
            values[name] = raw
        elif name == "changes_only":
            values[name] = raw.lower() in ("1", "true", "yes")
        else:
            try:
                number = float(raw)
            except ValueError:
                raise BodyError(422, "validation_error", f"{key} must be a number (epoch seconds)", key) from None
            if not math.isfinite(number):
                raise BodyError(422, "validation_error", f"{key} must be finite", key)
            values[name] = number
    params = HistoryParams(**values)
    if params.bucket_seconds is not None and params.bucket_seconds < 0:
        raise BodyError(422, "validation_error", "bucket must be >= 0", "bucket")
    return params
