"""Which revocations asked for on the log (from an operator machine) a controller applies: only
for a host its authority admitted, has not revoked yet, and has not admitted again since. The
ones it applies go to the servers (tests/security/test_revocation_visible.py); the ones it skips
need no server at all, which is what these check."""

from __future__ import annotations

from pathlib import Path

from grid.identity.admin import apply_requested_revocations, holds_authority
from grid.identity.permissions import Role
from tests.identities import ISSUED_AT, Identities

UNREACHABLE = "nats://127.0.0.1:1"


async def test_only_admitted_unrevoked_hosts_not_readmitted_since_are_applied(tmp_path: Path) -> None:
    ids = Identities(tmp_path / "grid")
    assert holds_authority(ids.home)
    for host in ("revoked-here", "readmitted"):
        ids.creds(Role.HOST, host)
    ids.authority.revoke_host("revoked-here", now=ISSUED_AT + 10)
    ids.authority.revoke_host("readmitted", now=ISSUED_AT + 10)
    ids.authority.readmit_host("readmitted", now=ISSUED_AT + 100)
    requested = {
        "never-admitted": (ISSUED_AT + 50, ""),
        "revoked-here": (ISSUED_AT + 50, ""),  # the confirmation of a revocation made here
        "readmitted": (ISSUED_AT + 50, ""),  # asked for before the host was admitted again
    }
    # Nothing to apply, so nothing reaches for a server.
    assert await apply_requested_revocations(ids.home, UNREACHABLE, requested, timeout=1.0) == []
    ids.authority.reload()
    assert not ids.authority.host_revoked("readmitted")


async def test_a_home_without_the_authority_applies_nothing(tmp_path: Path) -> None:
    assert not holds_authority(tmp_path / "operator-machine")
    assert await apply_requested_revocations(tmp_path / "operator-machine", UNREACHABLE,
                                             {"h": (1.0, "")}, timeout=1.0) == []
    assert not (tmp_path / "operator-machine").exists()  # no authority made there
