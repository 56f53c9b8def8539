"""What the log knows of authorship: the header names, a verdict, and the protocol of a signer.

The log signs what it appends and hands stored headers to its readers, but it knows nothing of
identities: grid.identity.signing implements `Authorship` for a process's credential, and
grid.identity.connect attaches it to the log. A log without one (a development server with no
identities, the scenario lab) neither signs nor verifies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import msgspec
import structlog

log = structlog.get_logger(__name__)

SIGNER_HEADER = "Grid-Signer"
SIG_HEADER = "Grid-Sig"


class Signed(msgspec.Struct, frozen=True, kw_only=True):
    """The verdict on one message: its signer, or the reason it has none that may write it."""

    reason: str = ""
    signer: str = ""
    role: str = ""
    host_id: str | None = None

    @property
    def ok(self) -> bool:
        return not self.reason


class Authorship(Protocol):
    public_key: str

    def sign(self, subject: str, data: bytes) -> dict[str, str]: ...

    def verify(self, subject: str, data: bytes, headers: Mapping[str, str] | None, *, at: float,
               revoked: Mapping[str, object] | None = None, signature_ok: bool | None = None) -> Signed: ...

    # A batch's signatures, split so a reader can check them on a worker thread (see
    # grid.identity.signing.Verifier.signatures): `prime` on the folding thread, then
    # `signatures` anywhere, then `verify(..., signature_ok=...)` in fold order.
    def prime(self, headers: Iterable[Mapping[str, str] | None]) -> None: ...

    def signatures(self, messages: Sequence[tuple[str, bytes, Mapping[str, str] | None]]) -> list[bool | None]: ...


class _Message(Protocol):
    subject: str
    data: bytes
    headers: Mapping[str, str] | None


async def check_signatures(authorship: Authorship | None, messages: Sequence[_Message]) -> list[bool | None]:
    """Whether each message's signature holds, checked in one call on a worker thread, in the
    messages' order: what a reader passes as `signature_ok` when it folds them (on its own
    thread, in order, where revocations and permissions are judged).

    None for a message the batch could not judge (no authorship, unknown signer, no signature):
    `verify` then checks it itself and rejects it with its reason. A batch that fails as a whole
    is judged message by message the same way, so one bad message never costs the others."""
    if authorship is None or not messages:
        return [None] * len(messages)
    try:
        authorship.prime(m.headers for m in messages)
        return await asyncio.to_thread(authorship.signatures, [(m.subject, m.data, m.headers) for m in messages])
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - each message is verified on its own instead
        log.warning("batch signature check failed; verifying one by one", error=f"{type(exc).__name__}: {exc}")
        return [None] * len(messages)


class Rejection(msgspec.Struct, frozen=True):
    """A stored message a reader refused to take as its claimed author's."""

    stream: str
    seq: int
    subject: str
    reason: str
    signer: str = ""
    role: str = ""


# Rejections a gate keeps for display (status, replay's diff): the latest ones; its counts are complete.
REJECTIONS_KEPT = 256

# Why a provably authored heartbeat is still not folded: its signed time (the event's own `at`,
# covered by the signature over subject + payload) is not newer than the host's last folded
# heartbeat, or older than its receipt time minus the allowed skew (a stored heartbeat published
# again, by the host itself or by anything that holds a copy); or it is signed further in the
# future than the skew (a heartbeat dated ahead would otherwise lock out the honest ones after it).
STALE_REPLAY = "stale_replay"
SIGNED_AHEAD = "signed_ahead"
HEARTBEAT_REJECTION_REASONS: tuple[str, ...] = (STALE_REPLAY, SIGNED_AHEAD)

# How far a heartbeat's signed time may lie from its receipt time (the JetStream timestamp).
# Agents beat every 2 s (grid.agent.options) and a host is stale after 30 s of silence
# (grid.fleet.HEARTBEAT_TIMEOUT_SECONDS, the seed's heartbeat freshness): 10 s covers five
# intervals of publish retries plus ordinary NTP-level clock error between host and server, and
# stays well under the timeout, so a heartbeat accepted can never describe the host as of longer
# ago than the grid lets a host be silent (a replay can only ever re-say what the host said in
# the last few seconds, and only if that was never folded: it must also be newer than the last).
# tests/unit/projections/test_heartbeat_freshness.py holds these relations.
SIGNED_TIME_SKEW_SECONDS = 10.0


def heartbeat_replay(last_signed_at: float | None, signed_at: float, received_at: float,
                     skew_seconds: float = SIGNED_TIME_SKEW_SECONDS) -> str | None:
    """Why a heartbeat signed at `signed_at` and received at `received_at` (log clock) must not be
    folded after one signed at `last_signed_at` (None: none folded yet for the host), or None.

    Pure: it reads the message's own signed time and receipt time only, so a replay of the log
    judges every heartbeat exactly as the live fold did."""
    if last_signed_at is not None and not signed_at > last_signed_at:
        return STALE_REPLAY
    if signed_at < received_at - skew_seconds:
        return STALE_REPLAY
    if signed_at > received_at + skew_seconds:
        return SIGNED_AHEAD
    return None


def describe_rejected(counts: Mapping[str, int]) -> str:
    """'N events rejected: reason=count, ...': the one wording of status and replay."""
    total = sum(counts.values())
    return f"{total} event{'' if total == 1 else 's'} rejected: " + ", ".join(
        f"{reason}={n}" for reason, n in sorted(counts.items()))


class AuthorshipGate:
    """What every reader of the log runs before it folds a message: who provably wrote it.

    Holds the revocations seen so far in this reader's order of the log (a `CredentialRevoked`
    revokes its keys from its own position on) and counts what it rejected, by reason. Without
    an authorship (a log with no identities) it admits everything: there is nothing to verify
    against.
    """

    def __init__(self, authorship: Authorship | None = None) -> None:
        self.authorship = authorship
        # Revoked signer key -> "<stream>:<seq>" of the revocation.
        self.revoked: dict[str, str] = {}
        # Host id -> signed time of its last heartbeat this reader folded (`fresh_heartbeat`).
        self.heartbeats: dict[str, float] = {}
        self.rejected: dict[str, int] = {}
        self.rejections: list[Rejection] = []

    def check(self, stream: str, seq: int, subject: str, data: bytes, headers: Mapping[str, str] | None,
              at: float, *, signature_ok: bool | None = None) -> Signed:
        if self.authorship is None:
            return Signed()
        verdict = self.authorship.verify(subject, data, headers, at=at, revoked=self.revoked,
                                         signature_ok=signature_ok)
        if not verdict.ok:
            self.reject(stream, seq, subject, verdict)
        return verdict

    def reject(self, stream: str, seq: int, subject: str, verdict: Signed) -> None:
        self.rejected[verdict.reason] = self.rejected.get(verdict.reason, 0) + 1
        self.rejections.append(Rejection(stream, seq, subject, verdict.reason, verdict.signer, verdict.role))
        if len(self.rejections) > REJECTIONS_KEPT:
            del self.rejections[: len(self.rejections) - REJECTIONS_KEPT]

    def fresh_heartbeat(self, stream: str, seq: int, subject: str, host_id: str, signed_at: float,
                        received_at: float, verdict: Signed) -> Signed:
        """`verdict` (the heartbeat's proven author) when the heartbeat is fresh (`heartbeat_replay`),
        which makes it the host's latest; otherwise the rejection, counted by its reason.

        Call it only for a heartbeat about to be folded (authorship proven, vouched for by its
        subject). Without an authorship nothing is signed, so `at` proves nothing: admitted."""
        if self.authorship is None:
            return verdict
        reason = heartbeat_replay(self.heartbeats.get(host_id), signed_at, received_at)
        if reason is not None:
            rejected = Signed(reason=reason, signer=verdict.signer, role=verdict.role, host_id=verdict.host_id)
            self.reject(stream, seq, subject, rejected)
            return rejected
        self.heartbeats[host_id] = signed_at
        return verdict

    def revoke(self, keys: tuple[str, ...], position: str) -> None:
        for key in keys:
            self.revoked.setdefault(key, position)

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    def reset(self) -> None:
        self.revoked = {}
        self.heartbeats = {}
        self.rejected = {}
        self.rejections = []
