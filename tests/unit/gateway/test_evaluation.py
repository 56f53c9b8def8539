"""The owner capability that marks inference as evaluation: the operator token, by digest."""

from __future__ import annotations

import os
from pathlib import Path

from grid.gateway.evaluation import MAX_TOKEN_BYTES, OWNER_TOKEN_FILE_ENV, OwnerCapability
from grid.secrets import write_owner_only


def test_nobody_may_mark_until_an_owner_token_exists_then_only_it(tmp_path: Path) -> None:
    path = tmp_path / "operator.token"
    owner = OwnerCapability.from_environ({}, path)
    assert not owner.check(b"anything")
    write_owner_only(path, b"owner-secret\n")  # the controller creates it later: read again
    assert owner.check(b"owner-secret") and owner.check(b" owner-secret ")
    for bad in (b"", b"  ", b"owner-secre", b"owner-secret2", b"OWNER-SECRET", b"x" * (MAX_TOKEN_BYTES + 1)):
        assert not owner.check(bad), bad


def test_an_unsafe_token_file_grants_nothing_and_the_env_names_another(tmp_path: Path) -> None:
    shared = tmp_path / "shared.token"
    shared.write_text("owner-secret\n")
    os.chmod(shared, 0o644)
    assert not OwnerCapability(shared).check(b"owner-secret")
    other = tmp_path / "elsewhere.token"
    write_owner_only(other, b"gateway-owner\n")
    cap = OwnerCapability.from_environ({OWNER_TOKEN_FILE_ENV: str(other)}, tmp_path / "operator.token")
    assert cap.path == other and cap.check(b"gateway-owner")
