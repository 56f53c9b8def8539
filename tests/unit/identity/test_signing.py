"""Authorship of log messages: the fold accepts exactly what the permission table lets the signer
write, signed by that signer over that subject, and nothing a forger or a reflector can make.

The expected answer is written out here by hand (who may write which family of subjects), not
computed from the table, so a mistake in either shows.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path

import msgspec

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grid.events.authorship import SIG_HEADER, SIGNER_HEADER
from grid.events.base import new_event_id
from grid.events.control import CredentialRevoked, ModeSet
from grid.events.log import InMemoryLog
from grid.events.subjects import ALL_STREAMS, stream_for_subject
from grid.identity.authority import Authority
from grid.identity.permissions import Principal, Role
from grid.identity.signing import (
    BAD_SIGNATURE,
    EXPIRED_SIGNER,
    NOT_PERMITTED,
    REVOKED_SIGNER,
    UNKNOWN_SIGNER,
    CERT_CLAIM,
    UNSIGNED,
    Identity,
    Signer,
    Verifier,
)
from grid.identity import jwt
from grid.identity.creds import read_creds
from grid.events import codec
from grid.projections.runner import CATALOG, ProjectionRunner

HOSTS = ("h1", "h.2")
SUBJECTS = (
    "grid.host.h1.heartbeat", "grid.host.h1.ack", "grid.host.h_2E2.heartbeat", "grid.host.h_2E2.registered",
    "grid.req.batch", "grid.req.completed",
    "grid.ctl.mode", "grid.ctl.profile.m", "grid.ctl.override.h1", "grid.ctl.revocation.h1",
    "grid.plan", "grid.cmd.h1", "grid.cmd.h_2E2",
)
SIGNERS = ("controller", "gateway", "operator", "reader", "invitee", "host:h1", "host:h.2")


def expected(signer: str, subject: str) -> bool:
    """Who may write what, by hand: the controller everything of the grid's, a host its own
    subjects, the gateway request features, the operator control events, nobody else anything."""
    if signer == "controller":
        return True
    if signer.startswith("host:"):
        token = {"h1": "h1", "h.2": "h_2E2"}[signer[5:]]
        return subject.startswith(f"grid.host.{token}.")
    if signer == "gateway":
        return subject.startswith("grid.req.")
    if signer == "operator":
        return subject.startswith("grid.ctl.")
    return False


def _principal(signer: str) -> Principal:
    if signer.startswith("host:"):
        return Principal(Role.HOST, host_id=signer[5:])
    if signer == "reader":
        return Principal(Role.READER, streams=ALL_STREAMS)
    return Principal(Role(signer))


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> tuple[Authority, dict[str, Identity]]:
    authority = Authority(tmp_path_factory.mktemp("authority"))
    folder = tmp_path_factory.mktemp("creds")
    now = time.time()
    identities = {
        signer: Identity.from_creds(authority.issue_creds(_principal(signer), folder / f"{i}.creds", now=now,
                                                         ttl_seconds=None))
        for i, signer in enumerate(SIGNERS)
    }
    return authority, identities


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(signer=st.sampled_from(SIGNERS), subject=st.sampled_from(SUBJECTS), payload=st.binary(max_size=256))
def test_verifier_accepts_exactly_what_the_table_allows(grid, signer: str, subject: str, payload: bytes) -> None:
    authority, identities = grid
    identity = identities[signer]
    verdict = Verifier(authority.account_public).verify(subject, payload, identity.sign(subject, payload), at=time.time())
    assert verdict.ok == expected(signer, subject), (signer, subject, verdict)
    if verdict.ok:
        assert verdict.signer == identity.public_key
    else:
        assert verdict.reason == NOT_PERMITTED


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(signer=st.sampled_from(SIGNERS), signed_for=st.sampled_from(SUBJECTS), stored_on=st.sampled_from(SUBJECTS),
       payload=st.binary(max_size=128), flip=st.booleans())
def test_a_signature_holds_only_for_its_own_subject_and_bytes(grid, signer: str, signed_for: str, stored_on: str,
                                                              payload: bytes, flip: bool) -> None:
    """A reflected message keeps its headers but lands on another subject; a tampered one keeps
    its subject but not its bytes: neither verifies."""
    authority, identities = grid
    headers = identities[signer].sign(signed_for, payload)
    data = payload + b"x" if flip else payload
    verdict = Verifier(authority.account_public).verify(stored_on, data, headers, at=time.time())
    if stored_on != signed_for or flip:
        assert verdict.reason == BAD_SIGNATURE
    else:
        assert verdict.ok == expected(signer, stored_on)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(signer=st.sampled_from(SIGNERS + ("unsigned", "other-grid")), subject=st.sampled_from(SUBJECTS))
def test_the_fold_takes_exactly_the_permitted_signed_events(grid, tmp_path_factory, signer: str, subject: str) -> None:
    """Through a real fold: the mode changes only when the permitted identity wrote it."""
    authority, identities = grid
    controller = identities["controller"]
    if signer == "other-grid":
        other = Authority(tmp_path_factory.mktemp("other"))
        writer = Identity.from_creds(other.issue_creds(Principal(Role.CONTROLLER), tmp_path_factory.mktemp("c") / "c",
                                                       now=time.time(), ttl_seconds=None))
    else:
        writer = identities.get(signer)
    log = InMemoryLog()
    event = ModeSet(event_id=new_event_id(), at=1.0, mode="observe")
    data = codec.encode(event)
    import asyncio

    async def run() -> ProjectionRunner:
        headers = writer.sign("grid.ctl.mode", data) if writer is not None else None
        await log.append_raw("grid.ctl.mode", data, msg_id=event.event_id, headers=headers)
        runner = ProjectionRunner((CATALOG,), authorship=controller)
        await runner.catch_up(log)
        return runner

    runner = asyncio.run(run())
    allowed = signer not in ("unsigned", "other-grid") and expected(signer, "grid.ctl.mode")
    assert (runner["catalog"].mode == "observe") == allowed
    if not allowed:
        reason = {"unsigned": UNSIGNED, "other-grid": UNKNOWN_SIGNER}.get(signer, NOT_PERMITTED)
        assert runner.rejected == {reason: 1}
        assert runner.gate.rejections[0].subject == "grid.ctl.mode"
    del subject


def test_forged_certificates_and_garbage_headers_are_unknown_signers(grid) -> None:
    authority, identities = grid
    verifier = Verifier(authority.account_public)
    host = identities["host:h1"]
    headers = host.sign("grid.plan", b"{}")
    body, sig = headers[SIGNER_HEADER].split(".")
    # A host promoting itself to controller in its certificate: the account's signature breaks.
    claims = msgspec.json.decode(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    promoted = base64.urlsafe_b64encode(msgspec.json.encode({**claims, "r": "controller"})).rstrip(b"=").decode()
    forged = {**headers, SIGNER_HEADER: f"{promoted}.{sig}"}
    assert verifier.verify("grid.plan", b"{}", forged, at=time.time()).reason == UNKNOWN_SIGNER
    assert verifier.verify("grid.plan", b"{}", {SIGNER_HEADER: "x", SIG_HEADER: "y"}, at=time.time()).reason == UNKNOWN_SIGNER
    assert verifier.verify("grid.plan", b"{}", {SIGNER_HEADER: "x.y", SIG_HEADER: "y"}, at=time.time()).reason == UNKNOWN_SIGNER
    assert verifier.verify("grid.plan", b"{}", {**headers, SIG_HEADER: "!!"}, at=time.time()).reason == BAD_SIGNATURE
    assert verifier.verify("grid.plan", b"{}", {}, at=time.time()).reason == UNSIGNED


def test_a_credential_without_a_certificate_signs_with_its_whole_jwt(grid, tmp_path: Path) -> None:
    """Credentials issued before certificates existed still sign; their JWT is the proof."""
    authority, identities = grid
    path = authority.issue_creds(Principal(Role.HOST, host_id="h1"), tmp_path / "h.creds", now=time.time(),
                                 ttl_seconds=None)
    user_jwt, seed = read_creds(path)
    claims = jwt.decode(user_jwt)
    assert CERT_CLAIM in claims
    assert len(Signer(user_jwt, seed).proof) < 400 < len(user_jwt)
    del claims[CERT_CLAIM], claims["iss"], claims["iat"], claims["jti"]
    legacy = Signer(jwt.encode(claims, authority._account, issued_at=int(time.time())), seed)
    assert legacy.proof == legacy.user_jwt
    headers = legacy.sign("grid.host.h1.heartbeat", b"{}")
    verifier = Verifier(authority.account_public)
    assert verifier.verify("grid.host.h1.heartbeat", b"{}", headers, at=time.time()).ok
    assert verifier.verify("grid.plan", b"{}", legacy.sign("grid.plan", b"{}"), at=time.time()).reason == NOT_PERMITTED


def test_expiry_is_judged_by_receipt_time(grid, tmp_path: Path) -> None:
    authority, _ = grid
    issued = 1_000_000.0
    host = Identity.from_creds(authority.issue_creds(Principal(Role.HOST, host_id="h1"), tmp_path / "h.creds",
                                                     now=issued, ttl_seconds=60.0))
    headers = host.sign("grid.host.h1.heartbeat", b"{}")
    verifier = Verifier(authority.account_public)
    assert verifier.verify("grid.host.h1.heartbeat", b"{}", headers, at=issued + 59).ok
    assert verifier.verify("grid.host.h1.heartbeat", b"{}", headers, at=issued + 61).reason == EXPIRED_SIGNER


async def test_a_revocation_rejects_the_key_from_its_log_position_on(grid, tmp_path: Path) -> None:
    authority, identities = grid
    controller, operator = identities["controller"], identities["operator"]
    log = InMemoryLog()

    async def mode(writer: Identity, value: str) -> None:
        event = ModeSet(event_id=new_event_id(), at=1.0, mode=value)  # type: ignore[arg-type]
        data = codec.encode(event)
        await log.append_raw("grid.ctl.mode", data, msg_id=event.event_id, headers=writer.sign("grid.ctl.mode", data))

    await mode(operator, "observe")
    revoke = CredentialRevoked(event_id=new_event_id(), at=2.0, host_id="ops", keys=(operator.public_key,))
    data = codec.encode(revoke)
    subject = "grid.ctl.revocation.ops"
    assert stream_for_subject(subject) == "GRID_CTL"
    await log.append_raw(subject, data, headers=controller.sign(subject, data))
    await mode(operator, "automatic")

    runner = ProjectionRunner((CATALOG,), authorship=controller)
    await runner.catch_up(log)
    assert runner["catalog"].mode == "observe"  # before the revocation: folded; after: rejected
    assert runner.rejected == {REVOKED_SIGNER: 1}
    # The same answer from a snapshot: revocations travel with the position.
    again = ProjectionRunner((CATALOG,), authorship=controller)
    again.restore_bytes(runner.snapshot_bytes())
    assert again.gate.revoked == runner.gate.revoked


async def test_a_catch_up_checks_signatures_in_batches_with_the_per_message_answer(grid) -> None:
    """Hundreds of messages across several signature batches (checked on a worker thread), forged
    and honest interleaved, a revocation half way: the same verdicts as folding one by one."""
    _, identities = grid
    controller, operator, host = identities["controller"], identities["operator"], identities["host:h1"]
    log = InMemoryLog()
    for i in range(700):
        event = ModeSet(event_id=new_event_id(), at=float(i), mode="observe" if i % 2 else "automatic")
        data = codec.encode(event)
        writer = (operator, host, controller)[i % 3]
        headers = writer.sign("grid.ctl.mode", data)
        if i % 7 == 0:
            headers = writer.sign("grid.ctl.other", data)  # signed for another subject
        await log.append_raw("grid.ctl.mode", data, headers=headers)
        if i == 350:
            revoke = codec.encode(CredentialRevoked(event_id=new_event_id(), at=float(i), host_id="ops",
                                                    keys=(operator.public_key,)))
            await log.append_raw("grid.ctl.revocation.ops", revoke,
                                 headers=controller.sign("grid.ctl.revocation.ops", revoke))
    batched = ProjectionRunner((CATALOG,), authorship=controller)
    await batched.catch_up(log)
    one_by_one = ProjectionRunner((CATALOG,), authorship=controller)
    async for msg in log.replay("GRID_CTL"):
        one_by_one.fold(msg)
    assert batched.rejected == one_by_one.rejected
    assert set(batched.rejected) == {BAD_SIGNATURE, NOT_PERMITTED, REVOKED_SIGNER}
    assert batched.snapshot_bytes() == one_by_one.snapshot_bytes()


async def _ctl_log_with_forgeries(controller: Identity, operator: Identity, host: Identity) -> InMemoryLog:
    """700 mode changes, honest and forged interleaved (signed for another subject, by a host,
    unsigned, a signature that is not base64), the operator's key revoked half way."""
    log = InMemoryLog()
    for i in range(700):
        event = ModeSet(event_id=new_event_id(), at=float(i), mode="observe" if i % 2 else "automatic")
        data = codec.encode(event)
        writer = (operator, host, controller)[i % 3]
        headers: dict[str, str] | None = writer.sign("grid.ctl.mode", data)
        if i % 7 == 0:
            headers = writer.sign("grid.ctl.other", data)  # signed for another subject
        elif i % 11 == 0:
            headers = None
        elif i % 13 == 0:
            headers = {**headers, SIG_HEADER: "not base64 at all!"}
        await log.append_raw("grid.ctl.mode", data, headers=headers)
        if i == 350:
            revoke = codec.encode(CredentialRevoked(event_id=new_event_id(), at=float(i), host_id="ops",
                                                    keys=(operator.public_key,)))
            await log.append_raw("grid.ctl.revocation.ops", revoke,
                                 headers=controller.sign("grid.ctl.revocation.ops", revoke))
    return log


async def test_a_live_follow_checks_what_arrived_in_batches_with_the_per_message_answer(grid) -> None:
    """The live follower takes what has arrived (up to a batch), checks its signatures in one
    worker-thread call and folds in order: the verdicts, the state and the positions of folding one
    by one, every forgery rejected with its reason and nothing else lost."""
    import asyncio

    _, identities = grid
    controller, operator, host = identities["controller"], identities["operator"], identities["host:h1"]
    log = await _ctl_log_with_forgeries(controller, operator, host)
    last = await log.last_sequence("GRID_CTL")
    followed = ProjectionRunner((CATALOG,), authorship=controller)
    batches: list[int] = []
    original = controller.signatures

    def counting(messages):  # type: ignore[no-untyped-def]
        batches.append(len(messages))
        return original(messages)

    controller.signatures = counting  # type: ignore[method-assign]
    try:
        follower = asyncio.create_task(followed.follow(log))
        for _ in range(500):
            if followed.positions.get("GRID_CTL", 0) >= last:
                break
            await asyncio.sleep(0.01)
        follower.cancel()
        with pytest.raises(asyncio.CancelledError):
            await follower
    finally:
        del controller.signatures
    one_by_one = ProjectionRunner((CATALOG,), authorship=controller)
    async for msg in log.replay("GRID_CTL"):
        one_by_one.fold(msg)
    assert followed.positions == one_by_one.positions == {"GRID_CTL": last}
    assert followed.rejected == one_by_one.rejected
    assert set(followed.rejected) == {BAD_SIGNATURE, NOT_PERMITTED, REVOKED_SIGNER, UNSIGNED}
    assert [(r.seq, r.reason) for r in followed.gate.rejections] == [(r.seq, r.reason)
                                                                   for r in one_by_one.gate.rejections]
    assert followed.snapshot_bytes() == one_by_one.snapshot_bytes()
    # What had arrived was checked in a few calls, not one per message.
    assert sum(batches) == last and max(batches) > 1 and len(batches) < last // 10


async def test_a_batch_check_that_fails_as_a_whole_costs_no_message(grid) -> None:
    """A worker-thread check that raises for the batch: every message is judged on its own
    instead, with the same verdicts (the honest ones folded, the forged ones rejected)."""
    from grid.events.authorship import check_signatures

    _, identities = grid
    controller, operator, host = identities["controller"], identities["operator"], identities["host:h1"]
    log = await _ctl_log_with_forgeries(controller, operator, host)
    messages = [m async for m in log.replay("GRID_CTL")]

    class Broken(Identity):
        def signatures(self, messages):  # type: ignore[no-untyped-def, override]
            raise RuntimeError("the batch check broke")

    broken = Broken(controller.signer, controller.verifier)
    assert await check_signatures(broken, messages) == [None] * len(messages)
    judged = ProjectionRunner((CATALOG,), authorship=broken)
    for msg, ok in zip(messages, await check_signatures(broken, messages)):
        judged.fold(msg, signature_ok=ok)
    expected_runner = ProjectionRunner((CATALOG,), authorship=controller)
    for msg, ok in zip(messages, await check_signatures(controller, messages)):
        expected_runner.fold(msg, signature_ok=ok)
    assert judged.snapshot_bytes() == expected_runner.snapshot_bytes()
    assert judged.rejected == expected_runner.rejected and judged.rejected
