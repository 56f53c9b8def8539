"""The controllers' authority state, kept in step through NATS itself.

Every controller of a grid holds the same authority keys, but the registry beside them (per
admitted host: its own account's seed, the user keys issued to it, the keys revoked; the other
revoked keys) and the invitation store are local files. A controller started from a bundle knew
only what the bundle held: it could not renew a host admitted since (it lacked the host
account's seed), the account JWTs it pushed at start dropped such hosts from INFER, and it
missed revocations and invitations made elsewhere. So each controller also writes what it knows
to a stream every controller reads, and merges what it reads into its local files.

Where: the stream GRID_AUTHORITY, subjects `grid.authority.<kind>.<name>` (one per admitted host,
per invitation, per revoked key that is no host's), created by the controller with the replica
count of the grid's other streams, keeping RECORD_HISTORY records per subject. A plain stream
rather than a KV bucket: the controller's credential already publishes `grid.>` and calls
`$JS.API.>`, while a bucket's `$KV.<bucket>.>` would be a new permission (and credentials issued
before it would lack it); no other role may reach either (grid.identity.permissions).

What: each message is one record, sealed with AES-256-GCM under a key derived (HKDF-SHA256) from
the GRID account's seed, which every controller holds and nothing else does, with the record's
subject as associated data. Any other identity that could read the stream learns nothing (host
account seeds are secrets), and nobody without the authority can write a record that opens: a
forged, corrupted or reflected message (the server writes API answers to any reply subject a
requester names: grid.identity.permissions) is skipped and counted, never merged, never a crash,
never a loss of the local registry. A record moved to another subject does not open either.
Keeping RECORD_HISTORY records per subject means a few such messages cannot push a subject's
real record out; should a flood do so, nothing is lost from any controller's files, and each
controller's next start publishes again what its files hold that the stream lacks.

How they merge (pure functions below, the same rule everywhere, so the order in which records
arrive does not matter: commutative, associative, idempotent):
  * keys issued: the union; keys revoked: the union, and a revoked key is never valid again
    (a revocation is never undone); revocation times: the latest per key;
  * whether the host is revoked, its command consumer and its account seed: from the record of
    the higher `generation` (every revocation and readmission bumps it); at equal generations a
    revoked record wins over an unrevoked one, then the later revocation, then the later
    readmission, then the larger seed (a deterministic choice where two controllers drew
    different seeds for one host, which only a registry from before hosts had accounts can do);
  * an invitation: once used, used (the earliest use wins).
A record can only add to what a controller knows, so replaying an old one, or reading records in
any order, never takes anything away. Revocations older than the longest credential lifetime are
pruned after a merge as `revoke_host` prunes them (every JWT they refused has expired), and an
invitation expired or used a day ago is not brought back (InvitationStore keeps those a day).

When: at start, before the controller provisions host consumers and hands the servers its account
JWTs, it reads the stream to its end and merges (`catch_up`), so it never pushes a JWT that drops
a host another controller admitted; if the stream cannot be read it pushes none (and tries again).
It then publishes what it knows that the stream lacks (a controller upgraded from before sharing
publishes its whole registry), reads what the stream gains every POLL_SECONDS (the stream's last
sequence, then the new records; no consumer held open), and publishes whenever its files change:
at once after a join, renewal or applied revocation, and within POLL_SECONDS of a change made by
another process on its machine (`gridctl invite`, `gridctl node revoke`).

Limits: a host admitted on one controller in the milliseconds before another starts may still be
missed by that start's push (the next admission or start pushes it again); two processes writing
one machine's registry file at once (a merge and `gridctl node revoke`) can lose one write, as
they could before.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import msgspec
import nats.js.errors
import structlog
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from nats.js import api

from grid.events.subjects import AUTHORITY_STREAM, AUTHORITY_SUBJECTS, authority_record_subject
from grid.identity.authority import HOST_CREDENTIAL_TTL_SECONDS, Authority, HostIdentityRecord, Registry
from grid.identity.invitations import Invitation, InvitationStore

log = structlog.get_logger(__name__)

KIND_HOST = "host"
KIND_INVITATION = "invitation"
KIND_REVOKED = "revoked"

# Records kept per subject: a few reflected junk messages cannot push the real one out.
RECORD_HISTORY = 16
# No byte limit, so nothing is reserved up front (as for the artifact store): JetStream reserves a
# stream's max_bytes out of the log budget's disk (grid.transport.log_budget), and this stream must
# exist on the smallest disk `gridctl up` accepts. Only controllers write it, and what it holds is
# bounded by its subjects (one per host, invitation and revoked key) times RECORD_HISTORY times
# RECORD_MAX_BYTES.
STREAM_MAX_BYTES = None
RECORD_MAX_BYTES = 256 << 10
# How often a controller looks whether another process on its machine changed its files.
POLL_SECONDS = 1.0
READ_TIMEOUT_SECONDS = 5.0
RETRY_SECONDS = 1.0
# An invitation expired or used this long ago is dropped (InvitationStore.create's rule).
INVITATION_KEEP_SECONDS = 86_400.0

_MAGIC = b"GRA1"
_NONCE_BYTES = 12
_SALT = b"grid.identity.shared_registry/v1"
_INFO = b"AES-256-GCM key of the controllers' shared authority records"

# Why a message of the stream was skipped (counted in SharedRegistry.rejected).
REJECTED_UNSEALED = "not_a_sealed_record"
REJECTED_UNDECRYPTABLE = "undecryptable"
REJECTED_MALFORMED = "malformed"
REJECTED_MISPLACED = "misplaced"


class RecordRejected(ValueError):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SharedHost(msgspec.Struct, frozen=True):
    """A host's record as shared: the registry entry and the revocations of its keys."""

    record: HostIdentityRecord
    revocations: dict[str, int] = msgspec.field(default_factory=dict)


class SharedRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One record's plaintext: exactly one of host, invitation, revoked_at is set, per `kind`."""

    kind: str
    name: str
    host: SharedHost | None = None
    invitation: Invitation | None = None
    revoked_at: int | None = None
    writer: str = ""
    written_at: float = 0.0


_record_decoder = msgspec.json.Decoder(SharedRecord)


# ---------------------------------------------------------------------- sealing
def record_key(authority_secret: bytes) -> bytes:
    """The records' AES-256-GCM key, derived from the GRID account's seed."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=_SALT, info=_INFO).derive(authority_secret)


def seal(key: bytes, subject: str, plaintext: bytes) -> bytes:
    nonce = os.urandom(_NONCE_BYTES)
    return _MAGIC + nonce + AESGCM(key).encrypt(nonce, plaintext, _MAGIC + subject.encode())


def unseal(key: bytes, subject: str, data: bytes) -> bytes:
    """The plaintext of a sealed record on `subject`, or RecordRejected."""
    if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + _NONCE_BYTES + 16:
        raise RecordRejected(REJECTED_UNSEALED)
    nonce = data[len(_MAGIC):len(_MAGIC) + _NONCE_BYTES]
    try:
        return AESGCM(key).decrypt(nonce, data[len(_MAGIC) + _NONCE_BYTES:], _MAGIC + subject.encode())
    except InvalidTag:
        raise RecordRejected(REJECTED_UNDECRYPTABLE) from None


def seal_record(key: bytes, record: SharedRecord) -> tuple[str, bytes]:
    subject = authority_record_subject(record.kind, record.name)
    return subject, seal(key, subject, msgspec.json.encode(record))


def open_record(key: bytes, subject: str, data: bytes) -> SharedRecord:
    """The record sealed in `data` on `subject`, checked to belong there, or RecordRejected."""
    plaintext = unseal(key, subject, data)
    try:
        record = _record_decoder.decode(plaintext)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise RecordRejected(REJECTED_MALFORMED) from None
    body = {KIND_HOST: record.host, KIND_INVITATION: record.invitation, KIND_REVOKED: record.revoked_at}
    if record.kind not in body or body[record.kind] is None:
        raise RecordRejected(REJECTED_MALFORMED)
    try:
        if authority_record_subject(record.kind, record.name) != subject:
            raise RecordRejected(REJECTED_MISPLACED)
    except ValueError:
        raise RecordRejected(REJECTED_MISPLACED) from None
    if record.kind == KIND_INVITATION and record.invitation is not None and record.invitation.invitation_id != record.name:
        raise RecordRejected(REJECTED_MISPLACED)
    return record


# ---------------------------------------------------------------------- merging (pure)
def _host_rank(r: HostIdentityRecord) -> tuple[Any, ...]:
    return (r.generation, r.revoked_at is not None, r.revoked_at or 0, r.readmitted_at or 0.0,
            r.account_seed or "", r.command_consumer)


def merge_host(a: HostIdentityRecord, b: HostIdentityRecord) -> HostIdentityRecord:
    """Two controllers' records of one host, as one (module docstring: the rule)."""
    winner = max(a, b, key=_host_rank)
    revoked_keys = set(a.revoked_keys) | set(b.revoked_keys)
    return HostIdentityRecord(
        command_consumer=winner.command_consumer,
        account_seed=winner.account_seed,
        keys=sorted((set(a.keys) | set(b.keys)) - revoked_keys),
        revoked_at=winner.revoked_at,
        revoked_keys=sorted(revoked_keys),
        readmitted_at=winner.readmitted_at,
        generation=winner.generation,
    )


def merge_revocations(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    """Every key revoked on either side, at the later time where both revoked it."""
    merged = dict(a)
    for key, at in b.items():
        merged[key] = max(at, merged.get(key, at))
    return dict(sorted(merged.items()))


def merge_shared_host(a: SharedHost, b: SharedHost) -> SharedHost:
    return SharedHost(record=merge_host(a.record, b.record), revocations=merge_revocations(a.revocations, b.revocations))


def merge_invitation(a: Invitation, b: Invitation) -> Invitation:
    """One invitation as two controllers saw it: used if either saw it used (the earliest use)."""
    base = max(a, b, key=lambda i: msgspec.json.encode(msgspec.structs.replace(i, used_at=None)))
    used = [u for u in (a.used_at, b.used_at) if u is not None]
    return msgspec.structs.replace(base, used_at=min(used) if used else None)


def merge_records(a: SharedRecord, b: SharedRecord) -> SharedRecord:
    """Two records of one subject, as one (the writer and time of the later write are kept)."""
    if (a.kind, a.name) != (b.kind, b.name):
        raise ValueError("records of different subjects")
    later = max(a, b, key=lambda r: (r.written_at, r.writer))
    if a.kind == KIND_HOST:
        assert a.host is not None and b.host is not None
        return msgspec.structs.replace(later, host=merge_shared_host(a.host, b.host))
    if a.kind == KIND_INVITATION:
        assert a.invitation is not None and b.invitation is not None
        return msgspec.structs.replace(later, invitation=merge_invitation(a.invitation, b.invitation))
    assert a.revoked_at is not None and b.revoked_at is not None
    return msgspec.structs.replace(later, revoked_at=max(a.revoked_at, b.revoked_at))


def _copy(record: HostIdentityRecord) -> HostIdentityRecord:
    """A record sharing no list with `record` (the authority changes its records in place)."""
    return msgspec.structs.replace(record, keys=list(record.keys), revoked_keys=list(record.revoked_keys))


def host_share(registry: Registry, host_id: str) -> SharedHost:
    """What a registry says of one host: its record, and the revocations of its keys."""
    record = registry.hosts[host_id]
    mine = set(record.keys) | set(record.revoked_keys)
    return SharedHost(record=_copy(record), revocations={k: at for k, at in sorted(registry.revocations.items()) if k in mine})


def other_revocations(registry: Registry) -> dict[str, int]:
    """The registry's revocations of keys that are no host's (invitees')."""
    host_keys = {k for r in registry.hosts.values() for k in (*r.keys, *r.revoked_keys)}
    return {k: at for k, at in sorted(registry.revocations.items()) if k not in host_keys}


def merge_into_registry(registry: Registry, records: Iterable[SharedRecord], *, now: float,
                        longest_ttl_seconds: float = HOST_CREDENTIAL_TTL_SECONDS) -> Registry:
    """`registry` with the host and revoked-key records merged in (a new Registry; the argument
    is not changed). Revocations older than the longest credential lifetime are left out, as
    `Authority.prune_revocations` leaves them."""
    hosts = dict(registry.hosts)
    revocations = dict(registry.revocations)
    for record in records:
        if record.kind == KIND_HOST and record.host is not None:
            current = hosts.get(record.name)
            hosts[record.name] = _copy(record.host.record) if current is None else merge_host(current, record.host.record)
            revocations = merge_revocations(revocations, record.host.revocations)
        elif record.kind == KIND_REVOKED and record.revoked_at is not None:
            revocations = merge_revocations(revocations, {record.name: record.revoked_at})
    cutoff = now - longest_ttl_seconds
    kept = {k: at for k, at in revocations.items() if at >= cutoff or registry.revocations.get(k) == at}
    return Registry(hosts=dict(sorted(hosts.items())), revocations=dict(sorted(kept.items())))


def merge_into_invitations(invitations: list[Invitation], records: Iterable[SharedRecord], *,
                           now: float) -> list[Invitation]:
    """The invitation list with the invitation records merged in; one that ended (expired or
    used) INVITATION_KEEP_SECONDS ago is not brought back."""
    by_id = {i.invitation_id: i for i in invitations}
    order = [i.invitation_id for i in invitations]
    for record in records:
        incoming = record.invitation
        if record.kind != KIND_INVITATION or incoming is None:
            continue
        current = by_id.get(incoming.invitation_id)
        if current is None:
            if max(incoming.expires_at, incoming.used_at or 0.0) <= now - INVITATION_KEEP_SECONDS:
                continue
            order.append(incoming.invitation_id)
            by_id[incoming.invitation_id] = incoming
        else:
            by_id[incoming.invitation_id] = merge_invitation(current, incoming)
    return [by_id[i] for i in order]


def local_records(registry: Registry, invitations: Iterable[Invitation], *, writer: str,
                  now: float) -> list[SharedRecord]:
    """Everything a controller's files hold, as records."""
    records = [SharedRecord(kind=KIND_HOST, name=h, host=host_share(registry, h), writer=writer, written_at=now)
               for h in sorted(registry.hosts)]
    records += [SharedRecord(kind=KIND_REVOKED, name=k, revoked_at=at, writer=writer, written_at=now)
                for k, at in other_revocations(registry).items()]
    records += [SharedRecord(kind=KIND_INVITATION, name=i.invitation_id, invitation=i, writer=writer, written_at=now)
                for i in invitations]
    return records


def news(shared: SharedRecord | None, local: SharedRecord) -> SharedRecord | None:
    """What to publish for one subject: the merge of the shared record and the local one, when
    the local one adds anything to it; else None."""
    if shared is None:
        return local
    merged = merge_records(shared, local)
    return None if _content(merged) == _content(shared) else merged


def _content(record: SharedRecord) -> SharedRecord:
    return msgspec.structs.replace(record, writer="", written_at=0.0)


# ---------------------------------------------------------------------- the controller's side
def ensure_stream_config(replicas: int) -> api.StreamConfig:
    return api.StreamConfig(
        name=AUTHORITY_STREAM, subjects=[AUTHORITY_SUBJECTS], retention=api.RetentionPolicy.LIMITS,
        storage=api.StorageType.FILE, discard=api.DiscardPolicy.OLD, max_msgs_per_subject=RECORD_HISTORY,
        max_bytes=STREAM_MAX_BYTES, max_msg_size=RECORD_MAX_BYTES, allow_direct=False, num_replicas=replicas,
    )


class SharedRegistry:
    """Keeps one controller's registry and invitations in step with the grid's shared records."""

    def __init__(self, authority: Authority, invitations: InvitationStore, event_log: Any, *,
                 writer: str = "", clock: Any = time.time) -> None:
        self.authority = authority
        self.invitations = invitations
        self.log = event_log
        self.writer = writer or f"{socket.gethostname()}:{os.getpid()}"
        self.clock = clock
        self._key = record_key(authority.record_secret())
        # The merge of every valid record read or written, per subject.
        self.shared: dict[str, SharedRecord] = {}
        # The last stream sequence read.
        self.position = 0
        self.caught_up = False
        self.rejected: dict[str, int] = {}
        self.published = 0
        self._lock = asyncio.Lock()
        self._files_seen: tuple[Any, ...] | None = None

    # --- reading
    def _read(self, subject: str, data: bytes, seq: int) -> SharedRecord | None:
        try:
            record = open_record(self._key, subject, data)
        except RecordRejected as exc:
            self.rejected[exc.reason] = self.rejected.get(exc.reason, 0) + 1
            skipped = sum(self.rejected.values())
            if skipped <= 10 or skipped % 100 == 0:  # a flood of junk is not a flood of log lines
                log.warning("identity.shared_record_skipped", subject=subject, seq=seq, reason=exc.reason,
                            skipped=skipped)
            return None
        current = self.shared.get(subject)
        self.shared[subject] = record if current is None else merge_records(current, record)
        return record

    def _apply(self, records: list[SharedRecord]) -> bool:
        """Merge records into the local files (synchronously: no await between read and write)."""
        if not records:
            return False
        now = self.clock()
        unchanged_since_publish = self._files_state() == self._files_seen
        changed = self.authority.update_registry(lambda registry: merge_into_registry(registry, records, now=now))
        with self.invitations.editing() as invitations:
            merged = merge_into_invitations(invitations, records, now=now)
            if merged != invitations:
                invitations[:] = merged
                changed = True
        if unchanged_since_publish:
            # What this merge wrote is in the shared state already: nothing to publish for it.
            self._files_seen = self._files_state()
        return changed

    async def ensure_stream(self) -> None:
        js = self.log.jetstream
        try:
            await js.stream_info(AUTHORITY_STREAM)
        except nats.js.errors.NotFoundError:
            try:
                await self.log.create_replicated(lambda replicas: js.add_stream(ensure_stream_config(replicas)))
            except nats.js.errors.APIError:
                await js.stream_info(AUTHORITY_STREAM)  # made meanwhile by another controller
            return
        with contextlib.suppress(Exception):  # a replica count differing is reported elsewhere
            await self.log.ensure_replicas(AUTHORITY_STREAM)

    async def _read_to_end(self) -> list[SharedRecord]:
        """The valid records after `position`, up to the stream's end as of now (raises when
        they do not arrive: `position` then stays at the last one read)."""
        end = await self.log.last_sequence(AUTHORITY_STREAM)
        records: list[SharedRecord] = []
        if end <= self.position:
            return records
        sub = await self.log.subscribe(AUTHORITY_STREAM, start_seq=self.position + 1,
                                       subject_filter=AUTHORITY_SUBJECTS)
        try:
            while self.position < end:
                msg = await sub.next(READ_TIMEOUT_SECONDS)
                if msg is None:
                    raise TimeoutError(f"{AUTHORITY_STREAM} did not deliver up to sequence {end}")
                self.position = msg.seq
                record = self._read(msg.subject, msg.data, msg.seq)
                if record is not None:
                    records.append(record)
        finally:
            await sub.close()
        return records

    async def _merge_new(self) -> int:
        records = await self._read_to_end()
        async with self._lock:
            if self._apply(records):
                log.info("identity.shared_records_merged", records=len(records), position=self.position)
        return len(records)

    async def catch_up(self) -> int:
        """Read the stream to its current end and merge it into the local files, then publish
        what they hold that it lacks. Returns how many records were merged. Raises when the
        stream cannot be read (the caller must then not push account JWTs built from the files)."""
        await self.ensure_stream()
        merged = await self._merge_new()
        self.caught_up = True
        await self.publish_changes()
        log.info("identity.shared_registry_caught_up", records=merged, position=self.position,
                 skipped=sum(self.rejected.values()))
        return merged

    def warnings(self) -> list[str]:
        """What status should say: records skipped, and a catch-up still owed."""
        out = []
        if self.rejected:
            reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(self.rejected.items()))
            out.append(f"shared authority records skipped ({reasons}): written by no controller of this grid")
        if not self.caught_up:
            out.append(f"{AUTHORITY_STREAM} not read yet: account JWTs are not pushed until it is")
        return out

    # --- writing
    async def publish_changes(self) -> int:
        """Publish every local record the shared state lacks something of. Returns how many."""
        if not self.caught_up:
            return 0
        async with self._lock:
            self._files_seen = self._files_state()
            self.authority.reload()
            now = self.clock()
            local = local_records(self.authority.registry, self.invitations.entries(), writer=self.writer, now=now)
            count = 0
            for record in local:
                subject = authority_record_subject(record.kind, record.name)
                new = news(self.shared.get(subject), record)
                if new is None:
                    continue
                new = msgspec.structs.replace(new, writer=self.writer, written_at=now)
                subject, data = seal_record(self._key, new)
                await self.log.append_raw(subject, data)
                self.shared[subject] = new
                count += 1
            self.published += count
        if count:
            log.info("identity.shared_records_published", records=count)
        return count

    def _files_state(self) -> tuple[Any, ...]:
        state: list[Any] = []
        for path in (self.authority.directory / "registry.json", self.invitations.path):
            try:
                st = Path(path).stat()
                state.append((st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                state.append(None)
        return tuple(state)

    # --- following
    async def run(self) -> None:
        """Until cancelled: merge what other controllers write, and publish what another process
        on this machine changed in the files, every POLL_SECONDS. Polls the stream's last
        sequence rather than holding a consumer open: one cheap request, and no message can be
        lost to a wait that timed out. Never raises otherwise."""
        while True:
            try:
                if not self.caught_up:
                    await self.catch_up()
                await self._merge_new()
                if self._files_state() != self._files_seen:
                    await self.publish_changes()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the stream or the servers unreachable: try again
                log.warning("identity.shared_registry_retry", error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(POLL_SECONDS)
