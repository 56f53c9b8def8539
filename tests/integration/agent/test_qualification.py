"""`gridctl qualify` with a real llama.cpp engine on the bundled model and a real NATS log: a pass
whose evidence the fleet projection folds and the planner places by, a wrong digest and an engine
killed mid-check each failing at the step that names it, and an unreachable external engine."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import msgspec
import pytest

from grid.agent.artifacts import BUNDLED_MODEL_ID, BUNDLED_SHA256
from grid.agent.engines import llama_cpp
from grid.agent.engines.runtime import Runtime
from grid.agent.qualification import (
    DIGEST_MISMATCH,
    ENGINE_EXITED,
    KEY_REFUSED,
    LLAMA_CPP_STEPS,
    PROMPT,
    RUNTIME_EXTERNAL,
    STEP_IDENTITY,
    STEP_INFERENCE,
    STEP_READINESS,
    STEP_REACHABILITY,
    UNREACHABLE,
    ExternalOptions,
    ExternalQualification,
    LlamaCppOptions,
    LlamaCppQualification,
    Observer,
    StepResult,
)
from grid.events.subjects import host_subject
from grid.planner.plan import plan
from grid.projections.runner import CORE_PROJECTIONS, ProjectionRunner
from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import JetStreamLog
from tests.ports import engine_ports
from tests.unit.planner.builders import host, mk, on, prof

pytestmark = [pytest.mark.integration, pytest.mark.engine]

HOST = "host-qualify"


def qualify(home: Path, state_dir: Path, nats_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GRID_AGENT_STATE_DIR", "GRID_NATS_URL")} | {
        "GRID_HOME": str(home), "COLUMNS": "300"}
    return subprocess.run([sys.executable, "-m", "grid.cli.main", "qualify", *args, "--state-dir", str(state_dir),
                           "--nats", nats_url, "--host-id", HOST, "--json"],
                          env=env, capture_output=True, text=True, timeout=240)


def ports_free(first: int, last: int) -> bool:
    return all(llama_cpp.port_free(p) for p in range(first, last + 1))


async def folded(log: JetStreamLog) -> ProjectionRunner:
    runner = ProjectionRunner(CORE_PROJECTIONS)
    await runner.catch_up(log)
    return runner


async def test_the_bundled_model_qualifies_and_a_profile_requiring_it_places_only_there(
    js_log: JetStreamLog, nats_server: EmbeddedNats, bundled_model_home: Path, tmp_path: Path,
    engine_runtime: Runtime,
) -> None:
    lo, hi = engine_ports(8)
    done = await asyncio.to_thread(qualify, bundled_model_home, tmp_path / "agent", nats_server.url,
                                   "llama.cpp", BUNDLED_MODEL_ID, "--port-range", f"{lo}-{hi}",
                                   "--engine-threads", "1")
    assert done.returncode == 0, done.stderr + done.stdout
    doc = json.loads(done.stdout)
    assert (doc["result"], doc["failed_step"], doc["host_id"]) == ("passed", None, HOST)
    assert [s["name"] for s in doc["steps"]] == list(LLAMA_CPP_STEPS)
    assert all(s["ok"] for s in doc["steps"])
    assert doc["artifact_sha256"] == BUNDLED_SHA256 and doc["recorded"] is not None
    assert ports_free(lo, hi)  # the engine it started is stopped

    stored = await js_log.last_message(host_subject(HOST, "qualification"))
    assert stored is not None and PROMPT.encode() not in stored.data
    runner = await folded(js_log)
    quals = runner["fleet"].hosts[HOST].qualifications
    assert [(q.runtime, q.model_id, q.artifact_sha256, q.passed) for q in quals] == [
        ("llama.cpp", BUNDLED_MODEL_ID, BUNDLED_SHA256, True)]

    # The planner, on the recorded evidence: only the qualified host takes a profile requiring it.
    qualified = msgspec.structs.replace(host(HOST), qualifications=quals)
    profile = prof(BUNDLED_MODEL_ID, 400, min_replicas=2, max_replicas=2, artifact_sha256=BUNDLED_SHA256,
                   require_qualified=True)
    assert on(plan(mk([profile], [host("host-unqualified"), qualified])), BUNDLED_MODEL_ID) == [HOST]


async def test_a_wrong_digest_fails_at_identity_and_is_recorded(
    js_log: JetStreamLog, nats_server: EmbeddedNats, bundled_model_home: Path, tmp_path: Path,
) -> None:
    lo, hi = engine_ports(8)
    done = await asyncio.to_thread(qualify, bundled_model_home, tmp_path / "agent", nats_server.url,
                                   "llama.cpp", BUNDLED_MODEL_ID, "--digest", "0" * 64, "--port-range", f"{lo}-{hi}")
    assert done.returncode == 1, done.stderr + done.stdout
    doc = json.loads(done.stdout)
    assert (doc["result"], doc["failed_step"], doc["reason"]) == ("failed", STEP_IDENTITY, DIGEST_MISMATCH)
    assert [s["name"] for s in doc["steps"]] == ["inventory", STEP_IDENTITY]
    assert ports_free(lo, hi)  # nothing was started
    runner = await folded(js_log)
    [q] = runner["fleet"].hosts[HOST].qualifications
    assert (q.passed, q.failed_step, q.reason, q.artifact_sha256) == (False, STEP_IDENTITY, DIGEST_MISMATCH,
                                                                      BUNDLED_SHA256)


class _KillAfter(Observer):
    """Kills the engine under test (SIGKILL) as soon as `step` has passed."""

    def __init__(self, run: LlamaCppQualification, step: str) -> None:
        self.run, self.step = run, step

    def finished(self, result: StepResult) -> None:
        if result.name == self.step and result.ok:
            assert self.run.engine_pid is not None
            os.kill(self.run.engine_pid, signal.SIGKILL)


async def test_an_engine_killed_mid_check_fails_the_step_that_finds_it_gone(
    bundled_model_home: Path, tmp_path: Path, engine_runtime: Runtime,
) -> None:
    lo, hi = engine_ports(8)
    run = LlamaCppQualification(LlamaCppOptions(
        model=BUNDLED_MODEL_ID, artifacts_dir=bundled_model_home / "artifacts", work_dir=tmp_path / "work",
        port_range=(lo, hi), threads=1))
    outcome = await run.run(_KillAfter(run, STEP_READINESS))
    assert not outcome.passed
    assert outcome.failure is not None
    assert (outcome.failure.name, outcome.failure.reason) == (STEP_INFERENCE, ENGINE_EXITED)
    assert [s.name for s in outcome.steps] == list(LLAMA_CPP_STEPS[:6])
    event = outcome.event(HOST, 1.0)
    assert (event.result, event.failed_step, event.reason) == ("failed", STEP_INFERENCE, ENGINE_EXITED)
    assert ports_free(lo, hi)
    assert not list((tmp_path / "work").iterdir())  # the engine key is gone with it


async def test_an_unreachable_external_engine_fails_at_reachability() -> None:
    outcome = await ExternalQualification(ExternalOptions(url=f"http://127.0.0.1:{engine_ports(1)[0]}",
                                                          model="m")).run()
    assert outcome.runtime == RUNTIME_EXTERNAL
    assert outcome.failure is not None
    assert (outcome.failure.name, outcome.failure.reason) == (STEP_REACHABILITY, UNREACHABLE)


async def test_an_external_engine_qualifies_and_is_never_signalled(
    js_log: JetStreamLog, nats_server: EmbeddedNats, bundled_model_home: Path, bundled_gguf: Path, tmp_path: Path,
    engine_runtime: Runtime,
) -> None:
    """A llama-server started outside Grid, with an API key: a wrong key fails at reachability, the
    right one passes reachability, identity and inference; the engine keeps running as it was."""
    key_file, wrong_key = tmp_path / "engine.key", tmp_path / "wrong.key"
    key_file.write_text("sk-qualify-external\n")
    wrong_key.write_text("sk-wrong\n")
    for f in (key_file, wrong_key):
        f.chmod(0o600)
    port = engine_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    with (tmp_path / "engine.log").open("wb") as log:
        proc = subprocess.Popen([*engine_runtime.command, "--model", str(bundled_gguf), "--host", "127.0.0.1",
                                 "--port", str(port), "--alias", "smol-external", "--api-key-file", str(key_file),
                                 "--ctx-size", "512", "--threads", "1", "--no-webui"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        async with httpx.AsyncClient(trust_env=False) as http:
            ready = await llama_cpp.wait_ready(http, url, "sk-qualify-external", timeout=120,
                                               alive=lambda: proc.poll() is None, interval=0.2)
        assert ready, (tmp_path / "engine.log").read_text()[-2000:]
        started = llama_cpp.capture_proof(proc.pid, port)
        wrong = await asyncio.to_thread(qualify, bundled_model_home, tmp_path / "agent", nats_server.url, "external",
                                        url, "--model", "smol-external", "--api-key-file", str(wrong_key))
        done = await asyncio.to_thread(qualify, bundled_model_home, tmp_path / "agent", nats_server.url, "external",
                                       url, "--model", "smol-external", "--api-key-file", str(key_file))
        # Both runs are over: the engine is the same process, never stopped or signalled.
        assert proc.poll() is None and llama_cpp.prove(started) == llama_cpp.PROOF_MATCH
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert wrong.returncode == 1, wrong.stderr
    assert (json.loads(wrong.stdout)["failed_step"], json.loads(wrong.stdout)["reason"]) == (STEP_REACHABILITY,
                                                                                         KEY_REFUSED)
    assert done.returncode == 0, done.stderr + done.stdout
    doc = json.loads(done.stdout)
    assert (doc["result"], doc["runtime"], doc["endpoint"]) == ("passed", RUNTIME_EXTERNAL, url)
    assert [s["name"] for s in doc["steps"]] == [STEP_REACHABILITY, STEP_IDENTITY, STEP_INFERENCE]
    runner = await folded(js_log)
    quals = {(q.runtime, q.model_id): q.passed for q in runner["fleet"].hosts[HOST].qualifications}
    assert quals == {(RUNTIME_EXTERNAL, "smol-external"): True}
