"""A host vouches only for itself: an enrolled hostile host trying to record a qualification for
another host, against a real nats-server in operator mode.

The server refuses the publish on the other host's subject; bytes that land there anyway (a
reflection, a future permission mistake) are rejected by the folds as not permitted; and an event
naming the other host on the hostile host's own subject is rejected as a subject mismatch. The
victim's own evidence, written with its own credential, is what every fold keeps.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grid.agent.artifacts import BUNDLED_MODEL_ID, BUNDLED_SHA256
from grid.events import codec
from grid.events.base import new_event_id
from grid.events.control import ModelProfile, ProfileSet
from grid.events.host import QualificationRecorded, QualificationStep
from grid.events.subjects import HOSTS_STREAM, host_subject
from grid.identity.connect import connect_log
from grid.identity.permissions import Role
from grid.identity.provenance import SUBJECT_MISMATCH
from grid.identity.signing import NOT_PERMITTED, Identity
from grid.projections.runner import CORE_PROJECTIONS, ProjectionRunner
from grid.transport.jetstream import JetStreamLog
from tests.security.conftest import CredsFactory, SecuredNats, raw_client

pytestmark = pytest.mark.security

EVIL = "evil-host"
VICTIM = "victim-host"
MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"


def evidence(host_id: str, *, passed: bool) -> QualificationRecorded:
    return QualificationRecorded(
        event_id=new_event_id(), at=time.time(), host_id=host_id, runtime="llama.cpp", model_id=MODEL,
        artifact_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        result="passed" if passed else "failed", failed_step=None if passed else "inference",
        reason="" if passed else "engine_exited",
        steps=(QualificationStep(name="inventory", ok=True, seconds=0.01),))


async def folded(log: JetStreamLog) -> ProjectionRunner:
    runner = ProjectionRunner(CORE_PROJECTIONS)
    await runner.catch_up(log)
    return runner


async def test_a_host_cannot_record_a_qualification_for_another_host(
    secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog
) -> None:
    # The victim records its own (failed) qualification with its own credential: kept.
    victim_log = await connect_log(secured_server.url, credentials=creds(Role.HOST, host_id=VICTIM),
                                   ensure_streams=False)
    try:
        await victim_log.append(evidence(VICTIM, passed=False))
    finally:
        await victim_log.close()
    before = await controller_log.last_sequence(HOSTS_STREAM)

    # The hostile host publishes a passing one on the victim's subject: the server refuses it.
    evil_creds = creds(Role.HOST, host_id=EVIL)
    evil = Identity.from_creds(evil_creds)
    forged = codec.encode(evidence(VICTIM, passed=True))
    target = host_subject(VICTIM, "qualification")
    nc = await raw_client(secured_server, evil_creds)
    try:
        await nc.publish(target, forged, headers=evil.sign(target, forged))
        await nc.flush()
        for _ in range(200):  # the server reports the violation asynchronously
            if nc.permission_errors:  # type: ignore[attr-defined]
                break
            await asyncio.sleep(0.01)
        assert any("permissions violation" in str(e).lower() for e in nc.permission_errors)  # type: ignore[attr-defined]
    finally:
        await nc.close()
    assert await controller_log.last_sequence(HOSTS_STREAM) == before

    # Landed anyway on the victim's subject, signed by the hostile host: not permitted.
    own, controller_log.authorship = controller_log.authorship, None
    try:
        await controller_log.append_raw(target, forged, msg_id=new_event_id(), headers=evil.sign(target, forged))
    finally:
        controller_log.authorship = own
    # On its own subject, naming the victim: the server stores it, no fold takes it as the victim's.
    evil_log = await connect_log(secured_server.url, credentials=evil_creds, ensure_streams=False)
    try:
        mine = host_subject(EVIL, "qualification")
        await evil_log.append_raw(mine, forged, msg_id=new_event_id(), headers=evil.sign(mine, forged))
    finally:
        await evil_log.close()

    runner = await folded(controller_log)
    assert runner.rejected == {NOT_PERMITTED: 1, SUBJECT_MISMATCH: 1}
    [kept] = runner["fleet"].hosts[VICTIM].qualifications
    assert (kept.passed, kept.failed_step) == (False, "inference")
    evil_record = runner["fleet"].hosts.get(EVIL)
    assert evil_record is None or not evil_record.qualifications


def qualify_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GRID_AGENT_STATE_DIR", "GRID_NATS_URL")} | {
        "GRID_HOME": str(home), "COLUMNS": "300"}
    return subprocess.run([sys.executable, "-m", "grid.cli.main", "qualify", *args], env=env, capture_output=True,
                          text=True, timeout=120)


async def test_gridctl_qualify_records_as_the_credentials_host_against_the_profiles_digest(
    secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog, bundled_model_home: Path,
    tmp_path: Path,
) -> None:
    """The CLI path with a host credential: the expected digest comes from the model's profile (read
    with the host's own permissions), the evidence is recorded under the credential's host, and
    naming another host is refused before anything runs."""
    await controller_log.append(ProfileSet(event_id=new_event_id(), at=time.time(), profile=ModelProfile(
        model_id=BUNDLED_MODEL_ID, memory_mb=400, artifact_sha256="0" * 64)))
    evil_creds = creds(Role.HOST, host_id=EVIL)
    common = ("--credentials", str(evil_creds), "--nats", secured_server.url, "--state-dir", str(tmp_path / "agent"),
              "--json")
    refused = await asyncio.to_thread(qualify_cli, bundled_model_home, "llama.cpp", BUNDLED_MODEL_ID,
                                      "--host-id", VICTIM, *common)
    assert refused.returncode == 2 and f"speaks for host {EVIL!r}" in refused.stderr, refused.stderr
    done = await asyncio.to_thread(qualify_cli, bundled_model_home, "llama.cpp", BUNDLED_MODEL_ID, *common)
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["host_id"], doc["failed_step"], doc["reason"]) == (EVIL, "identity", "digest_mismatch")
    runner = await folded(controller_log)
    assert runner.rejected == {}
    [q] = runner["fleet"].hosts[EVIL].qualifications
    assert (q.passed, q.failed_step, q.artifact_sha256) == (False, "identity", BUNDLED_SHA256)
    assert VICTIM not in runner["fleet"].hosts
