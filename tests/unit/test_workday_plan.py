"""The workday's pure parts: its workload bindings, the specialists' size from the fleet's
capacities, and per-phase request counts."""

from __future__ import annotations

import pytest

from grid.testfleet.demo import Answer
from grid.testfleet.state import FleetError
from grid.testfleet.workday import Phase, model_id_of, parse_bindings, size_specialists

FOUR = ["coding=coder", "research=shared", "marketing=shared", "sales=shared"]


def test_the_four_classes_bind_a_specialist_and_one_shared_model() -> None:
    assert parse_bindings(FOUR) == {"coding": "coder", "research": "shared", "marketing": "shared", "sales": "shared"}
    assert parse_bindings([*FOUR, "coding=coder"])["coding"] == "coder"  # repeated alike: one binding


@pytest.mark.parametrize("values, why", [
    (FOUR[:3], "binds exactly"),
    ([*FOUR, "design=shared"], "binds exactly"),
    (["coding=coder", "research=shared", "marketing=other", "sales=shared"], "share one model"),
    (["coding=shared", "research=shared", "marketing=shared", "sales=shared"], "another model"),
    (["coding=coder", "coding=other", "research=shared", "marketing=shared", "sales=shared"], "twice"),
    (["coding", "research=shared", "marketing=shared", "sales=shared"], "WORKLOAD=MODEL"),
])
def test_other_bindings_are_refused_with_the_reason(values: list[str], why: str) -> None:
    with pytest.raises(FleetError, match=why):
        parse_bindings(values)


def test_a_gguf_path_names_its_profile_by_file_name() -> None:
    assert model_id_of("~/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf") == "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    assert model_id_of("coder-sm") == "coder-sm"


def test_a_specialist_fits_a_throttled_larger_host_and_never_a_smaller_one() -> None:
    sizing = size_specialists({"h1": 1024, "h2": 5120, "h3": 5120})
    assert (sizing.larger_hosts, sizing.smaller_hosts) == (("h2", "h3"), ("h1",))
    mb = sizing.specialist_mb
    assert mb > 1024  # never on the smaller host
    assert mb * 1.05 <= (0.5 - 0.25) * 5120  # half a larger host, less a quarter for other processes
    # Uneven larger hosts: sized against the smaller of the two.
    assert size_specialists({"a": 6144, "b": 5120, "c": 1024}).larger_hosts == ("a", "b")


@pytest.mark.parametrize("capacities", [
    {"h1": 2048, "h2": 2048, "h3": 2048},  # no host is smaller
    {"h1": 2048, "h2": 2048},  # no third host
    {"h1": 1024, "h2": 3072, "h3": 3072},  # a throttled larger host cannot hold a specialist
    {"h1": 512, "h2": 5120, "h3": 5120},  # a throttled smaller host cannot hold the baseline
])
def test_capacities_that_cannot_tell_the_hosts_apart_are_refused(capacities: dict[str, int]) -> None:
    with pytest.raises(FleetError):
        size_specialists(capacities)


def test_a_phase_counts_answered_failed_and_retried_requests() -> None:
    phase = Phase("surge", 0.0)
    phase.answers = [
        Answer("p", "m", "m", "h1", 200, 2, 10.0, response_id="x", prompt_tokens=1, completion_tokens=1,
               content_chars=2),
        Answer("p", "m", None, None, 503, 4, 30.0, reason="model_not_ready"),
    ]
    assert phase.counts() == {"sent": 2, "answered": 1, "failed": 1, "retried": 2}
