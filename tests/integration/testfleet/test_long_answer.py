"""A non-streamed completion that takes longer than the gateway's connect timeout and its silence
bound is served: the engine sends its status only when it is done, and the host's agent says it
is working on it meanwhile (grid.infer.wire.H_WORKING, then a progress marker for every silent
sweep), so the gateway takes it neither for an absent agent nor for a silent one."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from grid.agent.artifacts import BUNDLED_MODEL_ID
from grid.agent.engines.runtime import Runtime
from grid.gateway.settings import GatewaySettings
from grid.infer import wire
from grid.infer.client import PROGRESS_MISSES
from tests.integration.testfleet.test_fleet_cli import gridctl, seed_fleet_models
from tests.ports import fleet_engine_port_base

pytestmark = pytest.mark.engine


@pytest.fixture
def gateway(tmp_path: Path, bundled_model_home: Path, engine_runtime: Runtime) -> Iterator[str]:
    seed_fleet_models(tmp_path, bundled_model_home)
    try:
        started = gridctl(tmp_path, "test", "start", "--machines", "1", "--engine-port-base",
                          str(fleet_engine_port_base(1)), "--json")
        assert started.returncode == 0, started.stderr
        yield json.loads(started.stdout)["gateway_url"]
    finally:
        gridctl(tmp_path, "test", "stop", timeout=180)


def test_a_non_streamed_answer_longer_than_the_connect_timeout_and_the_silence_bound_is_served(gateway: str) -> None:
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0, timeout=300)
    # Size the answer to this machine's speed: about four times the gateway's connect timeout
    # of generation, however fast or loaded (a shared machine's speed varies) the engine is.
    probe = client.completions.create(model=BUNDLED_MODEL_ID, prompt="Count slowly:", max_tokens=32,
                                      extra_body={"ignore_eos": True})
    per_token_ms = float(probe.model_extra["timings"]["predicted_per_token_ms"])  # type: ignore[index]
    # Longer than either bound the gateway puts on a silent agent.
    bound = max(GatewaySettings().upstream_connect_timeout, PROGRESS_MISSES * wire.PROGRESS_MAX_GAP_SECONDS)
    tokens = int(min(1800, max(64, 1.5 * (bound + 1.0) * 1000 / per_token_ms)))
    # The probe can run while the machine is busier than during the answer: a too short answer
    # is asked again, longer, until it outlasts the connect timeout (or the size limit).
    while True:
        t0 = time.monotonic()
        raw = client.completions.with_raw_response.create(
            model=BUNDLED_MODEL_ID, prompt="Count slowly:", max_tokens=tokens, extra_body={"ignore_eos": True})
        took = time.monotonic() - t0
        completion = raw.parse()
        assert raw.headers["x-grid-host"] == "h1"
        assert completion.choices[0].finish_reason == "length" and completion.usage is not None
        if took > bound + 1.0 or tokens >= 1800:
            break
        tokens = min(1800, tokens * 3)
    # The claim needs an answer slower than both bounds, or it proves nothing.
    assert took > bound + 1.0, (took, tokens, per_token_ms)
