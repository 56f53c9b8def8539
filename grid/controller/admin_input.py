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
from collections.abc import Callable
from typing import Annotated, Any, get_args, get_origin

import msgspec
from starlette.requests import Request

from grid.events.artifact_source import SourceError, parse_source
from grid.analytics.history import HistoryParams
from grid.events.control import MODEL_ID_MAX_LENGTH, ModelProfile, model_id_error
# The API's bounds on a profile's text and collections are declared with its fields; named here
# too, where they are applied.
from grid.events.profile_fields import (
    MAX_NAME_LENGTH as MAX_NAME_LENGTH,
    MAX_PROFILE_ITEMS as MAX_PROFILE_ITEMS,
    MAX_SOURCE_LENGTH as MAX_SOURCE_LENGTH,
    MAX_WORKLOAD_NAME_LENGTH as MAX_WORKLOAD_NAME_LENGTH,
    PROFILE_FIELDS,
    ProfileField,
    Range,
    plain,
)
from grid.events.profile_fields import field as profile_field

MAX_BODY_BYTES = 64 * 1024
# An operator's JSON body arrives in milliseconds; ten seconds is generous on any link.
BODY_TIMEOUT_SECONDS = 10.0
MAX_INCOMPLETE_BODIES = 16
MAX_MODEL_ID_LENGTH = MODEL_ID_MAX_LENGTH  # the grammar is grid.events.control's MODEL_ID_PATTERN
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

# Artifact source schemes the admin API accepts. hf:// and http(s):// name bytes any host may
# fetch (each is then parsed by the agents' grid.events.artifact_source.parse_source). No source at
# all, with artifact_sha256, means the grid's artifact store (what `gridctl pull` publishes).
# file:// is refused: a path names a file on whichever host the command reaches (an agent reads
# one only from directories its host allows, GRID_ARTIFACT_FILE_ROOTS), so it is a way to probe
# hosts' disks, never a portable source; anything unlisted is refused too.
ACCEPTED_SOURCE_SCHEMES: tuple[str, ...] = ("hf", "https", "http")


def _text(max_length: int) -> Any:
    return Annotated[str, msgspec.Meta(max_length=max_length)]


def _bounded(spec: ProfileField, tp: Any) -> Any:
    """The body's type of a profile field: the event's type `tp` with the API's bounds on its text
    and collections as `spec` declares them (the event decoder stays as it is, so old events
    still fold)."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is tuple and len(args) == 2 and args[0] is str and args[1] is Ellipsis:
        item = _text(spec.max_length or MAX_NAME_LENGTH)
        return Annotated[tuple[item, ...], msgspec.Meta(max_length=MAX_PROFILE_ITEMS)]  # type: ignore[valid-type]
    if origin is dict and args and args[0] is str:
        key = _text(spec.max_length or MAX_NAME_LENGTH)
        return Annotated[dict[key, args[1]], msgspec.Meta(max_length=MAX_PROFILE_ITEMS)]  # type: ignore[valid-type]
    if spec.max_length is None:
        return tp
    if tp is str:
        return _text(spec.max_length)
    if set(args) == {str, type(None)}:
        return _text(spec.max_length) | None
    raise TypeError(f"{spec.name}: max_length is declared, but {tp!r} is not text, a list or a map")


def _body_struct() -> type:
    """ModelProfile's fields minus model_id, strict about unknown fields (kept in sync), with the
    API's bounds on strings and collections (`_bounded`). A field without a declaration
    (grid.events.profile_fields) stops the import here."""
    fields = []
    for f in msgspec.structs.fields(ModelProfile):
        if f.name == "model_id":
            continue
        tp = _bounded(profile_field(f.name), f.type)
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


def _number_type(tp: Any) -> type:
    """int or float: the number a field's type (or a map's values) holds, to write its bounds as
    the type writes them."""
    tp = plain(tp)
    if get_origin(tp) is dict:
        tp = plain(get_args(tp)[1])
    return float if tp is float else int


def _check_range(name: str, value: Any, bound: Range, kind: type, prefix: str = "") -> None:
    """`value` within `bound` (None always is), else a refusal naming `name`; the bounds are
    written as the field's type writes them ("must be > 0", "must be > 0.0")."""
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        says = "must be a finite number"
    elif bound.gt is not None and value <= bound.gt:
        says = f"must be > {kind(bound.gt)}"
    elif bound.ge is not None and value < bound.ge:
        says = f"must be >= {kind(bound.ge)}"
    elif bound.le is not None and value > bound.le:
        says = f"must be <= {kind(bound.le)}"
    else:
        return
    note = f" ({bound.note})" if bound.note else ""
    raise _invalid(name, prefix + (bound.says or says + note))


def _check_declared(spec: ProfileField, value: Any, kind: type) -> None:
    """What `spec` declares of a value: a range, choices, names that are not blank, a list that
    is not empty."""
    name = spec.name
    if isinstance(value, dict):
        for key, item in sorted(value.items()):
            if spec.names and not key.strip():
                raise _invalid(name, f"{spec.names} names must not be empty")
            if spec.range is not None:
                _check_range(name, item, spec.range, kind, prefix=f"{key}: ")
        return
    if isinstance(value, tuple):
        if spec.required and not value:
            raise _invalid(name, f"at least one {spec.names} is required")
        if spec.names and any(not item.strip() for item in value):
            raise _invalid(name, f"{spec.names} names must not be empty")
        return
    if spec.choices and value not in spec.choices:
        raise _invalid(name, f"must be one of {', '.join(spec.choices)}")
    if spec.range is not None:
        _check_range(name, value, spec.range, kind)


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


# --- checks that are more than a declaration: each takes the field's value, the profile's values
# so far (those checked before it canonical) and the model id, and returns the canonical value.


def _digest(sha: str | None, values: dict[str, Any], model_id: str) -> str | None:
    if sha is None:
        return None
    sha = sha.strip().lower()
    if not _SHA256.match(sha):
        raise _invalid("artifact_sha256", "must be 64 hexadecimal characters")
    return sha


def _source(source: str | None, values: dict[str, Any], model_id: str) -> str | None:
    if source is not None:
        if values["artifact_sha256"] is None:
            raise _invalid("artifact_sha256", "artifact_source requires artifact_sha256")
        if values["artifact_size_mb"] is None:
            raise _invalid("artifact_size_mb", "artifact_source requires artifact_size_mb")
        _check_source(source)
    return source


def _at_least_min_replicas(count: int, values: dict[str, Any], model_id: str) -> int:
    if count < values["min_replicas"]:
        raise _invalid("max_replicas", "must be >= min_replicas")
    return count


def _not_itself(excludes: tuple[str, ...], values: dict[str, Any], model_id: str) -> tuple[str, ...]:
    if model_id in excludes:
        raise _invalid("colocation_excludes", "a model cannot exclude itself")
    return excludes


PROFILE_CHECKS: dict[str, Callable[[Any, dict[str, Any], str], Any]] = {
    "artifact_sha256": _digest,
    "artifact_source": _source,
    "max_replicas": _at_least_min_replicas,
    "colocation_excludes": _not_itself,
}

_NUMBER_TYPES = {f.name: _number_type(f.type) for f in msgspec.structs.fields(ModelProfile)}


def validate_profile(model_id: str, body: Any) -> ModelProfile:
    """Semantic checks beyond types, field by field in their declared order (the first refusal
    names its field); returns the canonical profile (sha256 lowercased)."""
    validate_model_id(model_id)
    values = {f.name: getattr(body, f.name) for f in msgspec.structs.fields(body)}
    for spec in PROFILE_FIELDS:
        _check_declared(spec, values[spec.name], _NUMBER_TYPES[spec.name])
        check = PROFILE_CHECKS.get(spec.name)
        if check is not None:
            values[spec.name] = check(values[spec.name], values, model_id)
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
