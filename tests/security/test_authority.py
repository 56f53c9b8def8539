"""The authority's material on disk, the JWTs it signs, invitations, and the rendered table."""

from __future__ import annotations

import os
import time
from pathlib import Path

import nkeys
import pytest
from nats_jwt.nkeys_ext import create_user_pair
from nats_jwt.v2.decoder import decode as reference_decode

from grid.events.subjects import host_subjects
from grid.identity import jwt
from grid.identity.authority import SYSTEM_CREDS_KEEP_SECONDS, Authority, AuthorityError, principal_from_claims
from grid.identity.creds import credential_principal, read_creds, write_creds
from grid.identity.enrolment import renewal_due
from grid.identity.invitations import (
    REFUSED_INVITATION_EXPIRED,
    REFUSED_INVITATION_USED,
    REFUSED_UNKNOWN_INVITATION,
    InvitationError,
    InvitationStore,
    JoinToken,
)
from grid.identity.permissions import HOST_MAX_PAYLOAD, ROLES, Principal, Role, render_security_table
from grid.secrets import SecretFileError


def test_material_is_owner_only_and_survives_a_restart(tmp_path: Path) -> None:
    authority = Authority(tmp_path / "identity")
    authority.host_principal("node-1")
    authority.system_creds(now=time.time())
    authority.write_server_config(now=time.time())
    assert authority.directory.stat().st_mode & 0o777 == 0o700
    files = [p for p in authority.directory.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"operator.nk", "system.nk", "account.nk", "registry.json", "nats-auth.conf"}
    assert [p.name for p in files if p.name.startswith("system-") and p.name.endswith(".creds")]
    for path in files:
        assert path.stat().st_mode & 0o777 == 0o600, path
    again = Authority(tmp_path / "identity")
    assert (again.operator_public, again.account_public) == (authority.operator_public, authority.account_public)
    assert again.host_principal("node-1") == authority.host_principal("node-1")


def test_a_seed_readable_by_others_is_refused(tmp_path: Path) -> None:
    Authority(tmp_path / "identity")
    (tmp_path / "identity" / "account.nk").chmod(0o644)
    with pytest.raises(AuthorityError, match="readable by others"):
        Authority(tmp_path / "identity")


def test_user_jwts_verify_and_decode_with_the_reference_library(tmp_path: Path) -> None:
    authority = Authority(tmp_path / "identity")
    now = time.time()
    path = authority.issue_creds(Principal(Role.HOST, host_id="node.1"), tmp_path / "h.creds", now=now,
                                 ttl_seconds=3600.0)
    token, seed = read_creds(path)
    # A host's users live in its own account (grid.identity.accounts); the grid's account, which
    # signs its certificate, is named in a claim of its own.
    host_account = authority.host_account_public("node.1")
    claims = jwt.verify(token, host_account)
    assert claims["exp"] == int(now + 3600.0) and claims["iss"] == host_account != authority.account_public
    assert claims["grid_account"] == authority.account_public
    assert authority.verify_user(token) == claims
    allow = claims["nats"]["pub"]["allow"]
    # Exactly its own subjects, no wildcard under its prefix; and a payload limit.
    assert [s for s in allow if s.startswith("grid.host.")] == list(host_subjects("node.1"))
    assert claims["nats"]["payload"] == HOST_MAX_PAYLOAD
    principal = principal_from_claims(claims)
    assert principal == credential_principal(path) == authority.host_principal("node.1")
    reference = reference_decode(token)
    assert reference.sub == claims["sub"] and reference.nats.pub.allow == claims["nats"]["pub"]["allow"]
    with pytest.raises(jwt.JWTError):
        jwt.verify(token, authority.operator_public)
    with pytest.raises(jwt.JWTError):
        jwt.verify(token, authority.account_public)
    tampered = token.replace(token.split(".")[1], token.split(".")[1][:-4] + "AAAA")
    with pytest.raises(jwt.JWTError):
        jwt.verify(tampered, host_account)
    assert seed.startswith("SU")


def test_revocation_is_in_the_host_account_jwt_and_blocks_issuing(tmp_path: Path) -> None:
    authority = Authority(tmp_path / "identity")
    key = create_user_pair().public_key.decode()
    authority.issue(Principal(Role.HOST, host_id="node-1"), key, now=1000.0, ttl_seconds=60.0)
    host_update, infer_update = authority.revoke_host("node-1", now=2000.0)
    assert host_update.account == authority.host_account_public("node-1")
    account = jwt.verify(host_update.token, authority.operator_public)
    assert account["nats"]["revocations"] == {key: 2000}
    # Gateways no longer reach the revoked host's inference service.
    infer = jwt.verify(infer_update.token, authority.operator_public)
    assert infer_update.account == authority.infer_account_public and "imports" not in infer["nats"]
    assert authority.key_revoked(key, issued_at=1000) and not authority.key_revoked(key, issued_at=2001)
    with pytest.raises(AuthorityError, match="revoked"):
        authority.issue(Principal(Role.HOST, host_id="node-1"), key, now=2001.0, ttl_seconds=60.0)
    old_consumer = authority.host_principal("node-1").command_consumer
    authority.readmit_host("node-1")
    assert authority.host_principal("node-1").command_consumer != old_consumer
    assert key in jwt.decode(authority.host_account_jwt("node-1", 3000.0))["nats"]["revocations"]


def test_revocations_older_than_the_longest_credential_lifetime_are_pruned(tmp_path: Path) -> None:
    authority = Authority(tmp_path / "identity")
    old, recent = (create_user_pair().public_key.decode() for _ in range(2))
    authority.issue(Principal(Role.HOST, host_id="node-1"), old, now=1000.0, ttl_seconds=60.0)
    authority.revoke_host("node-1", now=1000.0, longest_ttl_seconds=3600.0)
    authority.readmit_host("node-1")
    authority.issue(Principal(Role.HOST, host_id="node-1"), recent, now=5000.0, ttl_seconds=60.0)
    # 4000 s later every JWT the first revocation refused has expired: it is dropped.
    account = jwt.decode(authority.revoke_host("node-1", now=5000.0, longest_ttl_seconds=3600.0)[0].token)
    assert account["nats"]["revocations"] == {recent: 5000}
    assert Authority(tmp_path / "identity").registry.revocations == {recent: 5000}


def test_server_config_uses_the_full_resolver_with_every_account(tmp_path: Path) -> None:
    authority = Authority(tmp_path / "identity")
    authority.host_principal("node-1")
    config = authority.server_config(now=time.time())
    assert "type: full" in config and f"system_account: {authority.system_public}" in config
    preload = config.split("resolver_preload")[1]
    for account in (authority.system_public, authority.account_public, authority.invitee_account_public,
                    authority.host_account_public("node-1")):
        assert account in preload


def test_invitations_are_single_use_expiring_and_stored_as_hashes(tmp_path: Path) -> None:
    store = InvitationStore(tmp_path / "invitations.json")
    invitation, secret = store.create("node-1", now=100.0, ttl_seconds=60.0, tags=("gpu",))
    assert secret.encode() not in (tmp_path / "invitations.json").read_bytes()
    assert (tmp_path / "invitations.json").stat().st_mode & 0o777 == 0o600
    assert store.redeem("not-the-secret", now=110.0) == REFUSED_UNKNOWN_INVITATION
    used = store.redeem(secret, now=110.0)
    assert not isinstance(used, str) and used.host_id == "node-1" and used.used_at == 110.0
    assert store.redeem(secret, now=111.0) == REFUSED_INVITATION_USED
    _, late = store.create("node-2", now=100.0, ttl_seconds=60.0)
    assert store.redeem(late, now=160.0) == REFUSED_INVITATION_EXPIRED
    with pytest.raises(InvitationError):
        store.create("node-3", now=100.0, ttl_seconds=0)


def test_join_token_round_trips_and_rejects_garbage() -> None:
    token = JoinToken(servers=("tls://grid.example:4222",), secret="s", tls_fingerprint="sha256:ab",
                      invitee_jwt="a.b.c", invitee_seed="SU")
    assert JoinToken.decode(token.encode()) == token
    for bad in ("", "gridjoin1.!!!", "eyJ0eXAi"):
        with pytest.raises(InvitationError):
            JoinToken.decode(bad)


def test_security_table_lists_every_role_and_its_enforced_subjects() -> None:
    table = render_security_table()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == len(ROLES)
    host_row = next(r for r in rows if r.startswith("| host"))
    assert "`grid.host.<id>.heartbeat`" in host_row and "agent-<id>-<random>" in host_row
    assert "`grid.host.<id>.>`" not in host_row  # exact subjects only, no wildcard under its prefix
    assert "grid.cmd" not in host_row.split("|")[4]  # no command publish in the host's allow list


def test_creds_files_readable_by_others_are_refused(tmp_path: Path) -> None:
    authority = Authority(tmp_path / "identity")
    path = authority.issue_creds(Principal(Role.OPERATOR), tmp_path / "op.creds", now=time.time(), ttl_seconds=None)
    path.chmod(0o640)
    with pytest.raises(SecretFileError):
        read_creds(path)


def test_renewal_is_due_after_two_thirds_of_the_lifetime(tmp_path: Path) -> None:
    authority = Authority(tmp_path / "identity")
    host = authority.issue_creds(Principal(Role.HOST, host_id="node-1"), tmp_path / "h.creds", now=1000.0,
                                 ttl_seconds=3000.0)
    assert not renewal_due(host, 2999.0) and renewal_due(host, 3000.0)
    forever = authority.issue_creds(Principal(Role.GATEWAY), tmp_path / "g.creds", now=1000.0, ttl_seconds=None)
    assert not renewal_due(forever, 10**10)


def test_bulk_issued_host_credentials_equal_one_by_one_issuing_and_one_registry_write(tmp_path: Path) -> None:
    authority = Authority(tmp_path / "identity")
    authority.issue(Principal(Role.HOST, host_id="gone"), create_user_pair().public_key.decode(), now=1000.0,
                    ttl_seconds=60.0)
    authority.revoke_host("gone", now=1000.0)
    registry = authority.directory / "registry.json"
    before = registry.stat().st_mtime_ns
    issued = authority.issue_host_creds(["node-1", "node-2"], now=1000.0, ttl_seconds=3600.0)
    assert set(issued) == {"node-1", "node-2"}
    assert registry.stat().st_mtime_ns != before
    again = Authority(tmp_path / "identity")
    for host_id, (token, seed) in issued.items():
        claims = jwt.verify(token, again.host_account_public(host_id))
        assert claims["exp"] == 1000 + 3600 and seed.startswith(b"SU")
        # The same principal (and so the same grant and command consumer) one-by-one issuing gives.
        assert principal_from_claims(claims) == again.host_principal(host_id)
        assert claims["sub"] in again.registry.hosts[host_id].keys
        path = write_creds(tmp_path / f"{host_id}.creds", token, seed)
        assert credential_principal(path) == again.host_principal(host_id)
    assert [p.host_id for p in again.admitted_hosts()] == ["node-1", "node-2"]  # the revoked host is left out
    with pytest.raises(AuthorityError, match="revoked"):
        authority.issue_host_creds(["node-3", "gone"], now=1000.0, ttl_seconds=60.0)
    assert "node-3" not in Authority(tmp_path / "identity").registry.hosts


def test_each_claims_push_gets_a_credential_file_of_its_own(tmp_path: Path) -> None:
    """Two pushes at once (a controller and `gridctl node revoke` on its machine) must not read each
    other's key: each file holds the key its own JWT names, and stale files are pruned."""
    authority = Authority(tmp_path / "identity")
    first, second = authority.system_creds(now=time.time()), authority.system_creds(now=time.time())
    assert first != second and first.exists() and second.exists()
    for path in (first, second):
        user_jwt, seed = read_creds(path)
        assert jwt.decode(user_jwt)["sub"] == nkeys.from_seed(seed.encode()).public_key.decode()
    old = time.time() - SYSTEM_CREDS_KEEP_SECONDS - 60
    os.utime(first, (old, old))
    (authority.directory / "system.creds").write_text("left by an older version")
    third = authority.system_creds(now=time.time())
    assert not first.exists() and second.exists() and third.exists()
    assert not (authority.directory / "system.creds").exists()
