"""An enrolled but hostile host cannot make another host evict its predictive cache.

Evict deletes bytes from a host's disk, so its command must be exactly as hard to forge as a
drain: the server refuses a host's publish on another host's command subject, and an evict that
lands there anyway (unsigned, host-signed, or carrying a controller signature made for another
subject) or comes from a controller key that does not hold the lease is never executed: the
victim's unused predictive download stays on disk and stays predictive. The lease holder's own
evict of it still runs.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from grid.agent.artifacts import ArtifactCache
from grid.agent.fencing import REASON_NOT_LEASE_SIGNER
from grid.agent.outcomes import MSG_EVICTED
from grid.agent.service import HostAgent
from grid.events import codec
from grid.events.commands import PREDICTIVE_PREFETCH
from grid.events.subjects import command_subject
from grid.identity.connect import connect_log
from grid.identity.permissions import IMPORTED_JS_PREFIX, Role
from grid.identity.signing import BAD_SIGNATURE, NOT_PERMITTED, UNSIGNED, Identity
from grid.transport.artifact_store import ARTIFACT_CHUNK_SIZE, put_artifact
from grid.transport.jetstream import JetStreamLog
from tests.artifact_store import fresh_artifact_bucket
from tests.integration.agent.agentkit import make_command, terminal_acks, wait_ack, wait_for
from tests.security.conftest import CredsFactory, SecuredNats, raw_client
from tests.security.test_hostile_host import (  # noqa: F401 - victim_agent is a fixture
    CONTROLLER,
    EVIL,
    TERM,
    VICTIM,
    landed,
    permission_error,
    victim_agent,
)

MODEL = "predicted-model"


@pytest.fixture
async def stored(controller_log: JetStreamLog, secured_server: SecuredNats, creds: CredsFactory,
                 tmp_path: Path) -> AsyncIterator[str]:
    """An artifact in the grid's store, put by the operator; yields its sha256."""
    await fresh_artifact_bucket(controller_log)
    data = os.urandom(2 * ARTIFACT_CHUNK_SIZE + 321)
    path = tmp_path / "predicted.gguf"
    path.write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    operator = await raw_client(secured_server, creds(Role.OPERATOR))
    try:
        await put_artifact(operator.jetstream(prefix=IMPORTED_JS_PREFIX), path, sha)
    finally:
        await operator.close()
    yield sha


@pytest.fixture
async def victim(victim_agent: HostAgent, controller_log: JetStreamLog,  # noqa: F811
                 stored: str) -> AsyncIterator[tuple[HostAgent, str]]:
    """The victim agent with its own credential, holding a predictive download the lease
    holder's prefetch put there."""
    prefetch = make_command(kind="load", host_id=VICTIM, term=TERM, controller_id=CONTROLLER, model_id=MODEL,
                            reason=PREDICTIVE_PREFETCH, artifact_sha256=stored, artifact_size_mb=2)
    await controller_log.append(prefetch)
    ack = await wait_ack(controller_log, prefetch.action_id, timeout=60)
    assert (ack.status, ack.artifact_fetched) == ("succeeded", True), ack
    yield victim_agent, stored


def _still_predictive(agent: HostAgent, sha: str) -> bool:
    entry = agent.cache.lookup(MODEL)
    return agent.cache.has_blob(sha) and entry is not None and entry.sha256 == sha and entry.predictive


async def test_a_hostile_host_cannot_make_another_host_evict(
    victim: tuple[HostAgent, str], controller_log: JetStreamLog, secured_server: SecuredNats, creds: CredsFactory,
) -> None:
    agent, sha = victim
    assert _still_predictive(agent, sha)
    subject = command_subject(VICTIM)
    evil_creds = creds(Role.HOST, host_id=EVIL)

    def evict() -> object:
        return make_command(kind="evict", host_id=VICTIM, term=TERM, controller_id=CONTROLLER, model_id=MODEL,
                            artifact_sha256=sha)

    # The server refuses the hostile host's publish on the victim's command subject outright.
    evil = await raw_client(secured_server, evil_creds)
    try:
        await evil.publish(subject, codec.encode(evict()))  # type: ignore[arg-type]
        await evil.flush()
        await permission_error(evil, subject)
    finally:
        await evil.close()

    # Landed anyway (a reflection, or a future permission mistake): unsigned, signed by the
    # hostile host, or carrying a real controller signature made for another host's subject.
    forged = [evict() for _ in range(3)]
    data = [codec.encode(f) for f in forged]  # type: ignore[arg-type]
    await landed(controller_log, subject, data[0], None)
    await landed(controller_log, subject, data[1], Identity.from_creds(evil_creds).sign(subject, data[1]))
    await landed(controller_log, subject, data[2],
                 controller_log.authorship.sign(command_subject(EVIL), data[2]))  # type: ignore[union-attr]

    async def all_three_refused() -> bool | None:
        return sum(agent.unproven_commands.values()) >= 3 or None

    await wait_for(all_three_refused, timeout=20)
    assert agent.unproven_commands == {UNSIGNED: 1, NOT_PERMITTED: 1, BAD_SIGNATURE: 1}
    for f in forged:
        assert await terminal_acks(controller_log, f.action_id) == []  # type: ignore[attr-defined]

    # A controller credential of this grid that does not hold the lease: rejected, nothing deleted.
    other = await connect_log(secured_server.url, credentials=creds(Role.CONTROLLER), name="grid-controller-2",
                              ensure_streams=False)
    try:
        impostor = evict()
        await other.append(impostor)  # type: ignore[arg-type]
    finally:
        await other.close()
    ack = await wait_ack(controller_log, impostor.action_id)  # type: ignore[attr-defined]
    assert ack.status == "rejected" and REASON_NOT_LEASE_SIGNER in ack.message, ack
    assert _still_predictive(agent, sha)
    assert ArtifactCache(agent.config.artifacts_dir).has_blob(sha)

    # The lease holder's own evict of the same download runs.
    real = evict()
    await controller_log.append(real)  # type: ignore[arg-type]
    done = await wait_ack(controller_log, real.action_id)  # type: ignore[attr-defined]
    assert done.status == "succeeded" and done.message.startswith(MSG_EVICTED), done
    assert not agent.cache.has_blob(sha) and agent.cache.lookup(MODEL) is None
