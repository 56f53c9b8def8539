"""`gridctl model set`'s options are generated from the profile's declared fields
(grid.cli.profile_options); what they send, and what they refuse before sending, by option name.
Nothing listens at the admin URL: every case here is decided before a request."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from grid.cli.main import app
from grid.cli.profile_options import profile_values

NOWHERE = "http://127.0.0.1:9"


def gridctl(tmp_path: Path, *args: str) -> tuple[int, str]:
    env = {"GRID_HOME": str(tmp_path / "home"), "GRID_ADMIN_URL": None, "COLUMNS": "200"}
    result = CliRunner().invoke(app, ["model", "set", "m.gguf", "--admin", NOWHERE, *args], env=env)
    return result.exit_code, result.stderr


def test_options_not_given_send_nothing_and_given_ones_send_their_field() -> None:
    from grid.cli.profile_options import PROFILE_OPTIONS

    given = {o.param: ([] if o.kind in ("list", "map") else None) for o in PROFILE_OPTIONS}
    assert profile_values(given) == {}
    given.update(runtime=("a", "b"), workload_score=["coding=0.5"], runtime_memory_mb=["vllm=900"],
                 embeddings=False, priority=0, data_tier="public")
    assert profile_values(given) == {"runtimes": ["a", "b"], "workload_scores": {"coding": 0.5},
                                     "runtime_memory_mb": {"vllm": 900}, "embeddings": False, "priority": 0,
                                     "data_tier": "public"}


@pytest.mark.parametrize(("args", "needles"), [
    (["--workload-score", "coding=2"], ["--workload-score:", "<= 1.0"]),
    (["--workload-score", "coding"], ["--workload-score expects KEY=VALUE"]),
    (["--runtime-memory-mb", "vllm=lots"], ["--runtime-memory-mb", "is not a valid int"]),
    (["--context-size", str(10 ** 12)], ["--context-size:", "<= 16777216"]),
    (["--latency-slo-ms", "1e300"], ["--latency-slo-ms:", "<= 604800000"]),
])
def test_a_value_beyond_its_bound_is_refused_naming_the_option(tmp_path: Path, args: list[str],
                                                               needles: list[str]) -> None:
    rc, err = gridctl(tmp_path, "--memory-mb", "100", *args)
    assert rc != 0
    for needle in needles:
        assert needle in err, err


def test_help_states_each_default(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["model", "set", "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0
    for text in ("--runtime ", "Eligible runtime (repeat). (new profile: llama.cpp; existing: kept)",
                 "--memory-mb", "(required for a new profile; existing: kept)",
                 "--no-embeddings", "public | internal | confidential | restricted.",
                 "--workload-score", "WORKLOAD=SCORE in (0, 1] (repeat). (new profile: none; existing: kept)"):
        assert text in result.stdout, text
