"""The controllers' shared authority records: the merge rule (pure) and the sealing.

Properties (Hypothesis): merging is commutative, associative and idempotent, so the order in
which a controller reads records never matters; a revoked key is never valid again, and a
revocation is never lost to a merge; a record opens only under the grid's key and on its own
subject, and any change to its bytes is refused.
"""

from __future__ import annotations

import os

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grid.identity.authority import HostIdentityRecord, Registry
from grid.identity.invitations import Invitation
from grid.identity.shared_registry import (
    KIND_HOST,
    KIND_INVITATION,
    KIND_REVOKED,
    REJECTED_MISPLACED,
    REJECTED_UNDECRYPTABLE,
    REJECTED_UNSEALED,
    RecordRejected,
    SharedHost,
    SharedRecord,
    local_records,
    merge_host,
    merge_into_invitations,
    merge_into_registry,
    merge_invitation,
    merge_records,
    news,
    open_record,
    record_key,
    seal_record,
)

KEYS = [f"U{c * 55}" for c in "ABCDEFGH"]
NOW = 1_000_000.0

keys = st.lists(st.sampled_from(KEYS), max_size=5, unique=True)
host_records = st.builds(
    HostIdentityRecord,
    command_consumer=st.sampled_from(["agent-h-1", "agent-h-2", "agent-h-3"]),
    account_seed=st.sampled_from([None, "SAAAA", "SABBB"]),
    keys=keys,
    revoked_at=st.one_of(st.none(), st.integers(1, 50)),
    revoked_keys=keys,
    readmitted_at=st.one_of(st.none(), st.floats(1, 50, allow_nan=False)),
    generation=st.integers(0, 3),
)
revocations = st.dictionaries(st.sampled_from(KEYS), st.integers(int(NOW) - 100, int(NOW)), max_size=4)
shared_hosts = st.builds(SharedHost, record=host_records, revocations=revocations)
invitations = st.builds(
    Invitation, invitation_id=st.just("inv1"), secret_sha256=st.just("ab" * 32), host_id=st.just("h"),
    created_at=st.just(NOW - 10), expires_at=st.just(NOW + 900),
    used_at=st.one_of(st.none(), st.floats(NOW - 9, NOW, allow_nan=False)),
)


def host_record(share: SharedHost, writer: str = "a", at: float = 0.0) -> SharedRecord:
    return SharedRecord(kind=KIND_HOST, name="h", host=share, writer=writer, written_at=at)


def canonical(record: HostIdentityRecord) -> bytes:
    return msgspec.json.encode(merge_host(record, record))


@given(host_records, host_records)
def test_host_merge_is_commutative(a: HostIdentityRecord, b: HostIdentityRecord) -> None:
    assert merge_host(a, b) == merge_host(b, a)


@given(host_records, host_records, host_records)
def test_host_merge_is_associative(a: HostIdentityRecord, b: HostIdentityRecord, c: HostIdentityRecord) -> None:
    assert merge_host(merge_host(a, b), c) == merge_host(a, merge_host(b, c))


@given(host_records, host_records)
def test_host_merge_is_idempotent(a: HostIdentityRecord, b: HostIdentityRecord) -> None:
    once = merge_host(a, b)
    assert merge_host(once, once) == once
    assert merge_host(once, a) == once and merge_host(once, b) == once


@given(host_records, host_records)
def test_a_revoked_key_stays_revoked_and_no_key_is_lost(a: HostIdentityRecord, b: HostIdentityRecord) -> None:
    merged = merge_host(a, b)
    revoked = set(a.revoked_keys) | set(b.revoked_keys)
    assert set(merged.revoked_keys) == revoked
    assert not set(merged.keys) & revoked
    assert set(merged.keys) | revoked == set(a.keys) | set(b.keys) | revoked


@given(host_records, host_records)
def test_host_revocation_wins_unless_a_later_generation_readmitted(a: HostIdentityRecord,
                                                                    b: HostIdentityRecord) -> None:
    merged = merge_host(a, b)
    top = max(a.generation, b.generation)
    assert merged.generation == top
    revoked_at_top = [r for r in (a, b) if r.generation == top and r.revoked_at is not None]
    assert (merged.revoked_at is not None) == bool(revoked_at_top)


@given(shared_hosts, shared_hosts, shared_hosts)
@settings(max_examples=50)
def test_registry_merge_order_does_not_matter_and_keeps_every_revocation(
        a: SharedHost, b: SharedHost, c: SharedHost) -> None:
    records = [host_record(a), host_record(b), host_record(c)]
    start = Registry()
    forward = merge_into_registry(start, records, now=NOW)
    backward = merge_into_registry(start, list(reversed(records)), now=NOW)
    assert forward == backward
    # Folding one at a time is the same as all at once, and merging again changes nothing.
    stepwise = start
    for record in records:
        stepwise = merge_into_registry(stepwise, [record], now=NOW)
    assert stepwise == forward
    assert merge_into_registry(forward, records, now=NOW) == forward
    for share in (a, b, c):
        for key, at in share.revocations.items():
            assert forward.revocations[key] >= at


def test_registry_merge_leaves_its_argument_alone_and_prunes_expired_revocations() -> None:
    local = Registry(hosts={"h": HostIdentityRecord(command_consumer="agent-h-1", account_seed="SAAAA",
                                                    keys=[KEYS[0]])})
    before = msgspec.json.encode(local)
    remote = SharedHost(HostIdentityRecord(command_consumer="agent-h-1", account_seed="SAAAA", keys=[KEYS[1]],
                                           revoked_keys=[KEYS[0]], revoked_at=5, generation=1),
                        revocations={KEYS[0]: int(NOW), KEYS[2]: int(NOW) - 90_000})
    merged = merge_into_registry(local, [host_record(remote)], now=NOW)
    assert msgspec.json.encode(local) == before
    assert merged.hosts["h"].keys == [KEYS[1]] and merged.hosts["h"].revoked_keys == [KEYS[0]]
    assert merged.hosts["h"].revoked_at == 5
    assert merged.revocations == {KEYS[0]: int(NOW)}  # a day-old revocation is not brought back
    # The merged registry's record is its own: changing it does not change the record merged in.
    merged.hosts["h"].keys.append(KEYS[3])
    assert remote.record.keys == [KEYS[1]]


def test_a_readmission_of_a_later_generation_wins_and_brings_its_consumer() -> None:
    revoked = HostIdentityRecord(command_consumer="agent-h-1", account_seed="SAAAA", revoked_at=10,
                                 revoked_keys=[KEYS[0]], generation=1)
    readmitted = HostIdentityRecord(command_consumer="agent-h-2", account_seed="SAAAA", keys=[KEYS[1]],
                                    revoked_keys=[KEYS[0]], readmitted_at=20.0, generation=2)
    merged = merge_host(revoked, readmitted)
    assert merged.revoked_at is None and merged.command_consumer == "agent-h-2" and merged.keys == [KEYS[1]]
    # A revocation made concurrently with it (same generation) wins.
    again = HostIdentityRecord(command_consumer="agent-h-1", account_seed="SAAAA", revoked_at=11,
                               revoked_keys=[KEYS[0]], generation=2)
    assert merge_host(again, readmitted).revoked_at == 11


@given(invitations, invitations)
def test_invitation_merge_keeps_the_first_use(a: Invitation, b: Invitation) -> None:
    merged = merge_invitation(a, b)
    assert merged == merge_invitation(b, a) == merge_invitation(merged, a)
    used = [u for u in (a.used_at, b.used_at) if u is not None]
    assert merged.used_at == (min(used) if used else None)


def test_invitations_merge_in_and_old_ones_stay_out() -> None:
    fresh = Invitation(invitation_id="new", secret_sha256="00", host_id="h", created_at=NOW, expires_at=NOW + 60)
    old = Invitation(invitation_id="old", secret_sha256="11", host_id="h", created_at=NOW - 200_000,
                     expires_at=NOW - 199_000)
    used = msgspec.structs.replace(fresh, used_at=NOW + 1)
    records = [SharedRecord(kind=KIND_INVITATION, name=i.invitation_id, invitation=i) for i in (fresh, old)]
    assert merge_into_invitations([], records, now=NOW) == [fresh]
    assert merge_into_invitations([used], records, now=NOW) == [used]


def test_news_is_only_what_the_shared_state_lacks() -> None:
    registry = Registry(hosts={"h": HostIdentityRecord(command_consumer="c", account_seed="SAAAA", keys=[KEYS[0]])},
                        revocations={KEYS[5]: int(NOW)})
    local = local_records(registry, [], writer="a", now=NOW)
    assert [(r.kind, r.name) for r in local] == [(KIND_HOST, "h"), (KIND_REVOKED, KEYS[5])]
    shared = {(r.kind, r.name): r for r in local}
    again = local_records(registry, [], writer="b", now=NOW + 5)
    assert all(news(shared[(r.kind, r.name)], r) is None for r in again)
    registry.hosts["h"].keys.append(KEYS[1])
    (host, _) = local_records(registry, [], writer="b", now=NOW + 5)
    new = news(shared[(KIND_HOST, "h")], host)
    assert new is not None and new.host is not None and new.host.record.keys == sorted(KEYS[:2])


def test_record_merge_refuses_records_of_different_subjects() -> None:
    a = SharedRecord(kind=KIND_REVOKED, name=KEYS[0], revoked_at=1)
    with pytest.raises(ValueError):
        merge_records(a, SharedRecord(kind=KIND_REVOKED, name=KEYS[1], revoked_at=1))


# ---------------------------------------------------------------------- sealing
SEED = b"SAAGNJOZTRPYHBCSPAGG2R6AOUDWAQSIFGY2HCM4WAAFJEI2NBNSKVSUYQ"
RECORD = host_record(SharedHost(HostIdentityRecord(command_consumer="c", account_seed="SAsecret", keys=[KEYS[0]])))


def test_a_sealed_record_opens_under_the_grids_key_only() -> None:
    key = record_key(SEED)
    subject, data = seal_record(key, RECORD)
    assert subject == "grid.authority.host.h"
    assert b"SAsecret" not in data and KEYS[0].encode() not in data  # the seed is not readable
    assert open_record(key, subject, data) == RECORD
    with pytest.raises(RecordRejected) as refused:
        open_record(record_key(b"SAother" + SEED[7:]), subject, data)
    assert refused.value.reason == REJECTED_UNDECRYPTABLE


@given(st.data())
@settings(max_examples=60)
def test_any_tampered_byte_is_refused(data: st.DataObject) -> None:
    key = record_key(SEED)
    subject, sealed = seal_record(key, RECORD)
    index = data.draw(st.integers(0, len(sealed) - 1))
    flip = data.draw(st.integers(1, 255))
    tampered = sealed[:index] + bytes([sealed[index] ^ flip]) + sealed[index + 1:]
    with pytest.raises(RecordRejected):
        open_record(key, subject, tampered)


def test_a_record_moved_to_another_subject_or_junk_is_refused() -> None:
    key = record_key(SEED)
    subject, sealed = seal_record(key, RECORD)
    with pytest.raises(RecordRejected) as refused:
        open_record(key, "grid.authority.host.other", sealed)
    assert refused.value.reason == REJECTED_UNDECRYPTABLE
    for junk in (b"", b"{}", b'{"type":"io.nats.jetstream.api.v1.stream_info_response"}', os.urandom(64)):
        with pytest.raises(RecordRejected) as refused:
            open_record(key, subject, junk)
        assert refused.value.reason in (REJECTED_UNSEALED, REJECTED_UNDECRYPTABLE)


def test_a_record_naming_another_subject_inside_is_refused() -> None:
    """Sealed by a controller for one subject but naming another host inside: misplaced."""
    from grid.identity.shared_registry import seal

    key = record_key(SEED)
    inner = msgspec.structs.replace(RECORD, name="other")
    data = seal(key, "grid.authority.host.h", msgspec.json.encode(inner))
    with pytest.raises(RecordRejected) as refused:
        open_record(key, "grid.authority.host.h", data)
    assert refused.value.reason == REJECTED_MISPLACED
