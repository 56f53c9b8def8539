"""`gridctl node revoke` also puts the revocation on the log, so folds refuse the revoked key by
log position.

The servers disconnect a revoked host at once, but a message that key signed can still reach a
stream later: a stored one copied back by anyone who may publish on its subject, or a key that
leaked. Here the controller's own connection (which may publish on any host subject) appends a
heartbeat the old host key signed, after the revocation: a runner rejects it as revoked_signer,
while the same key's heartbeat from before the revocation still folds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grid.events import codec
from grid.events.control import CredentialRevoked
from grid.events.host import HostHeartbeat, HostResources
from grid.events.subjects import CONTROL_STREAM, HOSTS_STREAM, revocation_subject
from grid.identity.admin import revoke
from grid.identity.authority import Authority
from grid.identity.connect import connect_log
from grid.identity.permissions import Role
from grid.identity.signing import REVOKED_SIGNER, Identity
from grid.projections.runner import CORE_PROJECTIONS, ProjectionRunner
from grid.transport.jetstream import JetStreamLog
from tests.security.conftest import CredsFactory, SecuredNats

pytestmark = pytest.mark.slow


def heartbeat(host_id: str, n: int) -> HostHeartbeat:
    return HostHeartbeat(event_id=f"hb-{host_id}-{n}-{time.monotonic_ns()}", at=time.time(), host_id=host_id,
                         resources=HostResources(capacity_mb=8000 + n))


async def test_a_revoked_keys_later_messages_are_rejected_and_its_earlier_ones_still_fold(
    secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog, operator_home: Path,
) -> None:
    host_creds = creds(Role.HOST, host_id="node-1")
    old_key = Identity.from_creds(host_creds)  # what a thief of the host's creds file would hold
    host = await connect_log(secured_server.url, credentials=host_creds, ensure_streams=False)
    try:
        before = await host.append(heartbeat("node-1", 1))
    finally:
        await host.close()

    done = await revoke(operator_home, secured_server.url, "node-1", reason="laptop lost")
    assert old_key.public_key in done.keys and done.stream == CONTROL_STREAM

    # The revocation on the log: the keys, signed by the operator identity.
    (stored,) = [m async for m in controller_log.replay(CONTROL_STREAM) if m.seq == done.seq]
    assert stored.subject == revocation_subject("node-1")
    verdict = controller_log.authorship.verify(stored.subject, stored.data, stored.headers, at=stored.time)
    assert verdict.ok and verdict.role == Role.OPERATOR.value

    # A message the old key signed, stored after the revocation through a connection that may still
    # publish there (the controller's): it lands, and it is signed correctly for its subject.
    own = controller_log.authorship
    controller_log.authorship = old_key
    try:
        after = await controller_log.append(heartbeat("node-1", 2))
    finally:
        controller_log.authorship = own
    assert after.seq > before.seq

    runner = ProjectionRunner(CORE_PROJECTIONS)
    await runner.catch_up(controller_log)
    assert runner.rejected == {REVOKED_SIGNER: 1}
    (rejection,) = runner.gate.rejections
    assert (rejection.stream, rejection.seq, rejection.reason, rejection.role) == (
        HOSTS_STREAM, after.seq, REVOKED_SIGNER, Role.HOST.value)
    assert runner.gate.revoked[old_key.public_key] == f"{CONTROL_STREAM}:{done.seq}"
    # The heartbeat from before the revocation is folded: node-1 is known with its capacity then.
    assert runner["fleet"].hosts["node-1"].heartbeat.resources.capacity_mb == 8001


async def test_gridctl_node_revoke_appends_the_revocation(
    secured_server: SecuredNats, creds: CredsFactory, controller_log: JetStreamLog, operator_home: Path,
    authority: Authority,
) -> None:
    key = Identity.from_creds(creds(Role.HOST, host_id="node-2")).public_key
    env = {**os.environ, "GRID_HOME": str(operator_home), "GRID_NATS_URL": secured_server.url}
    proc = subprocess.run([sys.executable, "-m", "grid.cli.main", "node", "revoke", "node-2", "--reason", "stolen"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "host node-2 revoked" in proc.stdout and f"{CONTROL_STREAM} sequence" in proc.stdout
    revocations = [m async for m in controller_log.replay(CONTROL_STREAM)
                   if m.subject == revocation_subject("node-2")]
    assert len(revocations) == 1
    event = codec.decode(revocations[0].data)
    assert isinstance(event, CredentialRevoked) and key in event.keys and event.reason == "stolen"
    authority.reload()
    assert key in authority.registry.hosts["node-2"].revoked_keys and not authority.registry.hosts["node-2"].keys
