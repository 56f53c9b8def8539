"""A test grid's authority and one signing identity per role, without a server.

    ids = Identities(tmp_path)
    log = InMemoryLog(clock, authorship=ids.controller)      # appends signed as the controller
    ids.host("node-1")                                        # that host's identity (one key per host)
    ids.fresh(Role.HOST, "node-1")                            # another key for the same principal
    Identities(tmp_path / "elsewhere").controller             # a key another grid's account issued

Credentials never expire (`ttl_seconds=None`) unless a test asks for a lifetime with `fresh`.
Servers in operator mode (tests/security/conftest.py) take the same `Authority`.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from grid.identity.authority import Authority
from grid.identity.permissions import Principal, Role
from grid.identity.signing import Identity

# Issue time of every test credential (before any simulated clock the tests start).
ISSUED_AT = 1_700_000_000.0

_serial = itertools.count(1)


class Identities:
    """An authority under `directory`/identity (a grid home's layout) and identities it issued."""

    def __init__(self, directory: Path, *, now: float = ISSUED_AT) -> None:
        self.home = Path(directory)
        self.authority = Authority(self.home / "identity")
        self.now = now
        self._made: dict[tuple[Role, str | None], Identity] = {}

    @property
    def account(self) -> str:
        """The account public key every identity here is verified against."""
        return self.authority.account_public

    def creds(self, role: Role, host_id: str | None = None, *, ttl_seconds: float | None = None,
              now: float | None = None, streams: tuple[str, ...] = ()) -> Path:
        """A new creds file (a fresh user key) for the principal."""
        principal = Principal(role, host_id=host_id, streams=streams)
        directory = self.home / "test-creds"
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = directory / f"{role.value}-{host_id or 'x'}-{next(_serial)}.creds"
        return self.authority.issue_creds(principal, path, now=self.now if now is None else now,
                                          ttl_seconds=ttl_seconds)

    def fresh(self, role: Role, host_id: str | None = None, **kwargs: object) -> Identity:
        """A new identity (its own key) for the principal: `creds` keyword arguments apply."""
        return Identity.from_creds(self.creds(role, host_id, **kwargs))  # type: ignore[arg-type]

    def of(self, role: Role, host_id: str | None = None) -> Identity:
        """The identity of the principal, made once per instance."""
        key = (role, host_id)
        if key not in self._made:
            self._made[key] = self.fresh(role, host_id)
        return self._made[key]

    def host(self, host_id: str) -> Identity:
        return self.of(Role.HOST, host_id)

    @property
    def controller(self) -> Identity:
        return self.of(Role.CONTROLLER)

    @property
    def gateway(self) -> Identity:
        return self.of(Role.GATEWAY)

    @property
    def operator(self) -> Identity:
        return self.of(Role.OPERATOR)

    @property
    def reader(self) -> Identity:
        return self.of(Role.READER)
