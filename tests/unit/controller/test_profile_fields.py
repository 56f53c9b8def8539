"""A profile field is declared once (ModelProfile and grid.events.profile_fields) and reaches every
edge: one `gridctl model set` option, the admin API's bodies and checks, the OpenAPI document.
A field added in one place and forgotten in another fails here; so does an admin route missing
from the document. The refusals the declarations produce are pinned word for word."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
import typer.main

from grid.analytics.history import VIEWS as HISTORY_VIEWS
from grid.cli.main import app
from grid.cli.profile_options import PROFILE_OPTIONS, option_help, option_of, profile_values
from grid.controller.admin_input import (
    PROFILE_CHECKS,
    BodyError,
    ForecastWindowBody,
    ModeBody,
    ProfileBody,
    ProfilePatch,
    TickBody,
    decode_body,
    merge_profile,
    patch_decoder,
    profile_decoder,
    validate_profile,
)
from grid.controller.api import ROUTES
from grid.controller.evaluations import EvaluationBody
from grid.controller.openapi import build_openapi
from grid.events.control import ModelProfile
from grid.events.profile_fields import FIELDS, PROFILE_FIELDS, field

PROFILE = [f.name for f in msgspec.structs.fields(ModelProfile) if f.name != "model_id"]
# The command's own options, not profile fields.
OWN_OPTIONS = {"model_id", "replace", "json_out", "admin", "token_file"}
# Values a generic one would not pass: the semantic checks beyond a declaration.
SAMPLES = {"artifact_sha256": "ab" * 32, "artifact_source": "hf://owner/repo/m.gguf"}
SHA = "ab" * 32


def _model_set() -> Any:
    return typer.main.get_command(app).commands["model"].commands["set"]  # type: ignore[attr-defined]


def _openapi() -> dict[str, Any]:
    return build_openapi(ProfileBody, ModeBody, TickBody, tuple(sorted(HISTORY_VIEWS)), ProfilePatch,
                         evaluation_body=EvaluationBody, forecast_window_body=ForecastWindowBody)


def test_every_profile_field_is_declared_once_and_nothing_else_is() -> None:
    declared = [f.name for f in PROFILE_FIELDS]
    assert len(declared) == len(set(declared))
    assert sorted(declared) == sorted(PROFILE)
    assert set(PROFILE_CHECKS) <= set(FIELDS)
    with pytest.raises(LookupError, match="no declaration"):
        field("not_a_field")


def test_every_declared_field_has_exactly_one_model_set_option() -> None:
    params = {p.name: p for p in _model_set().params}
    options = {o.param: o for o in PROFILE_OPTIONS}
    assert len(options) == len(PROFILE_FIELDS)
    assert set(params) == OWN_OPTIONS | set(options)
    for option in PROFILE_OPTIONS:
        param = params[option.param]
        assert param.opts == [option.spec.cli_option], option.spec.name
        assert param.help == option_help(option)
        assert option_of(option.spec.name) == option.spec.cli_option
        assert param.multiple == (option.kind in ("list", "map")), option.spec.name
        assert param.is_flag == (option.kind == "flag"), option.spec.name
    # In the declared order, after the model id.
    names = [p.name for p in _model_set().params]
    assert names[1:len(PROFILE_OPTIONS) + 1] == [o.param for o in PROFILE_OPTIONS]


def _sample_args() -> list[str]:
    """An option for every declared field, each with a value the admin API accepts."""
    args = []
    for option in PROFILE_OPTIONS:
        spec, flag = option.spec, option.spec.cli_option
        bound = spec.range
        number = 1 if bound is None else (bound.ge if bound.ge is not None else 1)
        if option.kind == "flag":
            args.append(flag)
        elif option.kind == "list":
            args += [flag, "v1"]
        elif option.kind == "map":
            args += [flag, f"k={option.cast(number)}"]
        elif spec.name in SAMPLES:
            args += [flag, SAMPLES[spec.name]]
        elif spec.choices:
            args += [flag, spec.choices[-1]]
        else:
            args += [flag, str(option.cast(number))]
    return args


def test_every_option_reaches_the_admin_validation_and_the_profile() -> None:
    ctx = _model_set().make_context("set", ["m", *_sample_args()])
    body = profile_values(ctx.params)
    assert sorted(body) == sorted(PROFILE)
    profile = validate_profile("m", decode_body(profile_decoder, json.dumps(body).encode()))
    expected = msgspec.convert({"model_id": "m", **body}, ModelProfile)
    assert profile == expected
    # Each field alone is a partial update the API takes (of a profile with the digest and size
    # a source needs).
    current = ModelProfile(model_id="m", memory_mb=100, artifact_sha256=SHA, artifact_size_mb=5)
    for name, value in body.items():
        patch = decode_body(patch_decoder, json.dumps({name: value}).encode())
        merged = validate_profile("m", merge_profile(current, patch))
        assert getattr(merged, name) == getattr(expected, name), name


def test_every_declared_field_is_in_the_openapi_bodies() -> None:
    schemas = _openapi()["components"]["schemas"]
    for name in ("ProfileBody", "ProfilePatch"):
        assert sorted(schemas[name]["properties"]) == sorted(PROFILE), name
        assert schemas[name]["additionalProperties"] is False
    required = [f.name for f in msgspec.structs.fields(ModelProfile) if f.required and f.name != "model_id"]
    assert schemas["ProfileBody"]["required"] == required
    assert not schemas["ProfilePatch"].get("required")


# Routes the document leaves out on purpose: the document itself, and the id-less models path
# (a 404 saying where the id goes).
UNDOCUMENTED = {("/openapi.json", "get"), ("/allocator/models", "put"), ("/allocator/models", "patch"),
                ("/allocator/models", "delete")}


def test_the_document_has_an_operation_for_each_admin_route_and_no_other() -> None:
    routes = set()
    for route in ROUTES:
        path = route.path.replace(":path}", "}")
        routes |= {(path, m.lower()) for m in route.methods or () if m != "HEAD"}
    documented = {(path, method) for path, ops in _openapi()["paths"].items() for method in ops}
    assert documented == routes - UNDOCUMENTED
    assert UNDOCUMENTED <= routes


def test_operations_refer_to_their_schemas_by_name() -> None:
    doc = _openapi()
    model = doc["paths"]["/allocator/models/{model_id}"]

    def ref(content: dict[str, Any]) -> str:
        return content["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]

    assert ref(model["put"]["requestBody"]["content"]) == "ProfileBody"
    assert ref(model["patch"]["requestBody"]["content"]) == "ProfilePatch"
    assert ref(model["put"]["responses"]["200"]["content"]) == "ProfileSetResponse"
    assert ref(model["delete"]["responses"]["200"]["content"]) == "ProfileRetiredResponse"
    assert ref(model["put"]["responses"]["422"]["content"]) == "ErrorBody"
    window = doc["paths"]["/allocator/forecast-window"]["put"]
    assert ref(window["requestBody"]["content"]) == "ForecastWindowBody"
    assert ref(window["responses"]["200"]["content"]) == "ForecastWindowResponse"
    evaluation = doc["paths"]["/allocator/evaluations"]["post"]
    assert ref(evaluation["requestBody"]["content"]) == "EvaluationBody"
    assert ref(evaluation["responses"]["200"]["content"]) == "EvaluationResponse"
    drain = doc["paths"]["/allocator/hosts/{host_id}/drain-check"]["get"]
    assert ref(drain["responses"]["200"]["content"]) == "DrainCheck" and "security" not in drain
    assert doc["paths"]["/allocator/tick"]["post"]["requestBody"]["required"] is False
    # Without the optional bodies, their routes are left out.
    bare = build_openapi(ProfileBody, ModeBody, TickBody, ("plans",), ProfilePatch)
    assert "/allocator/evaluations" not in bare["paths"] and "/allocator/forecast-window" not in bare["paths"]
    assert "EvaluationBody" not in bare["components"]["schemas"]


# Each refusal of validate_profile, as the API words it (for a PUT body and for a PATCH merged
# into an existing profile alike).
REFUSALS: list[tuple[dict[str, Any], str, str]] = [
    ({"memory_mb": 0}, "memory_mb", "must be > 0 (resident runtime budget of one replica, MB)"),
    ({"runtimes": []}, "runtimes", "at least one runtime is required"),
    ({"runtimes": [" "]}, "runtimes", "runtime names must not be empty"),
    ({"runtime_memory_mb": {" ": 3}}, "runtime_memory_mb", "runtime names must not be empty"),
    ({"runtime_memory_mb": {"b": 0, "a": 0}}, "runtime_memory_mb", "a: must be > 0"),
    ({"artifact_sha256": "xyz"}, "artifact_sha256", "must be 64 hexadecimal characters"),
    ({"artifact_size_mb": 0}, "artifact_size_mb", "must be > 0"),
    ({"artifact_source": "hf://o/r/m.gguf"}, "artifact_sha256", "artifact_source requires artifact_sha256"),
    ({"artifact_source": "hf://o/r/m.gguf", "artifact_sha256": SHA}, "artifact_size_mb",
     "artifact_source requires artifact_size_mb"),
    ({"artifact_source": "ftp://x/y", "artifact_sha256": SHA, "artifact_size_mb": 3}, "artifact_source",
     "scheme must be one of hf://, https://, http://"),
    ({"artifact_source": "https://u@h/m.gguf", "artifact_sha256": SHA, "artifact_size_mb": 3}, "artifact_source",
     "credentials do not belong in the source URI"),
    ({"artifact_source": "https://h/m\t.gguf", "artifact_sha256": SHA, "artifact_size_mb": 3}, "artifact_source",
     "must not contain control characters or whitespace other than spaces"),
    ({"artifact_source": "hf://o/r/m.bin", "artifact_sha256": SHA, "artifact_size_mb": 3}, "artifact_source",
     "hf:// source must name a .gguf file"),
    ({"min_replicas": 3, "max_replicas": 1}, "max_replicas", "must be >= min_replicas"),
    ({"data_tier": "secret"}, "data_tier", "must be one of public, internal, confidential, restricted"),
    ({"min_failure_domains": 0}, "min_failure_domains", "must be >= 1"),
    ({"colocation_excludes": ["m"]}, "colocation_excludes", "a model cannot exclude itself"),
    ({"workload_scores": {" ": 0.5}}, "workload_scores", "workload names must not be empty"),
    ({"workload_scores": {"b": 0.0, "a": 0.0}}, "workload_scores", "a: score must be in (0, 1]"),
    ({"target_utilization": 0}, "target_utilization", "must be > 0.0"),
    ({"expected_service_seconds": 0}, "expected_service_seconds", "must be > 0.0"),
    ({"latency_slo_ms": 0}, "latency_slo_ms", "must be > 0.0"),
    ({"replica_concurrency": 0}, "replica_concurrency", "must be >= 1"),
    ({"context_size": 0}, "context_size", "must be > 0"),
    # The first field at fault, in the declared order.
    ({"memory_mb": 0, "runtimes": []}, "memory_mb", "must be > 0 (resident runtime budget of one replica, MB)"),
    ({"min_replicas": 2, "max_replicas": 1, "data_tier": "x"}, "max_replicas", "must be >= min_replicas"),
]


@pytest.mark.parametrize(("values", "field_at_fault", "detail"), REFUSALS)
def test_each_refusal_names_its_field_in_the_same_words(values: dict[str, Any], field_at_fault: str,
                                                        detail: str) -> None:
    body = json.dumps({"memory_mb": 5, **values}).encode()
    with pytest.raises(BodyError) as put:
        validate_profile("m", decode_body(profile_decoder, body))
    current = ModelProfile(model_id="m", memory_mb=7)
    with pytest.raises(BodyError) as patch:
        validate_profile("m", merge_profile(current, decode_body(patch_decoder, body)))
    for refusal in (put.value, patch.value):
        assert (refusal.status, refusal.error, refusal.field, refusal.detail) == \
            (422, "validation_error", field_at_fault, detail)


def test_non_finite_and_out_of_range_numbers_keep_their_wording() -> None:
    current = validate_profile("m", decode_body(profile_decoder, b'{"memory_mb": 5}'))
    for name, value, detail in (("target_utilization", float("nan"), "must be a finite number"),
                                ("load_seconds", float("inf"), "must be a finite number"),
                                ("workload_scores", {"c": float("nan")}, "c: score must be in (0, 1]"),
                                ("latency_slo_ms", -1.0, "must be > 0.0")):
        with pytest.raises(BodyError) as refused:
            validate_profile("m", merge_profile(current, ProfilePatch(**{name: value})))
        assert (refused.value.field, refused.value.detail) == (name, detail)


def test_a_valid_profile_is_canonical() -> None:
    body = {"memory_mb": 5, "artifact_sha256": " " + SHA.upper() + " ", "artifact_size_mb": 3,
            "artifact_source": "hf://o/r/m.gguf", "latency_slo_ms": None}
    profile = validate_profile("m", decode_body(profile_decoder, json.dumps(body).encode()))
    assert profile.artifact_sha256 == SHA and profile.artifact_source == "hf://o/r/m.gguf"
    assert profile == ModelProfile(model_id="m", memory_mb=5, artifact_sha256=SHA, artifact_size_mb=3,
                                   artifact_source="hf://o/r/m.gguf")
