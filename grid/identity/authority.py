"""The trust root of one grid: operator -> accounts (SYS, GRID, INVITEE, INFER, GATEWAYS,
OPERATORS, READERS, one per host) -> users, kept owner-only on disk. grid.identity.accounts says
why every role but the controller has an account of its own, and what crosses between them.

Layout of the authority directory (0700; every file 0600):
  operator.nk, system.nk, account.nk   nkey seeds of the operator, the system and the GRID account
  invitee.nk, infer.nk                 nkey seeds of the INVITEE and INFER accounts
  gateways.nk, operators.nk, readers.nk
                                       nkey seeds of the GATEWAYS, OPERATORS and READERS accounts
  registry.json                        per host: its account's seed, user keys issued, revocation;
                                       the revocations of every account
  system-<key>.creds                   a SYS user that pushes account updates to the servers (one
                                       per push; pruned after SYSTEM_CREDS_KEEP_SECONDS)
  nats-auth.conf                       the snippet a nats-server config includes

Server side we use the NATS "full" account resolver rather than `resolver: MEMORY`: the memory
resolver only learns an account JWT from its config file (a reload per change, and impossible
for a server or cluster we do not run), while the full resolver accepts an operator-signed
account JWT pushed on `$SYS.REQ.ACCOUNT.<account>.CLAIMS.UPDATE`, stores it, propagates it
through a cluster and, when the new JWT revokes a user key, closes that user's connections at
once. That is how `revoke_host` disconnects a host within seconds, embedded server or not.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import nkeys
from nats_jwt.nkeys_ext import create_account_pair, create_operator_pair, create_user_pair, keypair_from_pubkey

from grid.identity import accounts, jwt, signing
from grid.identity.accounts import INFER_JWT_CLAIM, AccountJWT
from grid.identity.creds import write_creds
from grid.identity.permissions import Principal, Role, grant_for, new_host_consumer, principal_from_tags, principal_tags
from grid.secrets import write_owner_only

OPERATOR_NAME = "grid"
ACCOUNT_NAME = "GRID"
SYSTEM_ACCOUNT_NAME = "SYS"
INVITEE_ACCOUNT_NAME = "INVITEE"
INFER_ACCOUNT_NAME = "INFER"
HOST_CREDENTIAL_TTL_SECONDS = 24 * 3600.0
# The claims pusher's credential files (system_creds): one per push, removed this long after.
SYSTEM_CREDS_PREFIX = "system-"
SYSTEM_CREDS_KEEP_SECONDS = 600.0


class AuthorityError(RuntimeError):
    pass


class HostIdentityRecord(msgspec.Struct):
    command_consumer: str
    # The seed of the host's own NATS account (drawn on first use; a record written before hosts
    # had accounts gets one then).
    account_seed: str | None = None
    keys: list[str] = msgspec.field(default_factory=list)
    revoked_at: int | None = None
    # Every key `revoke_host` revoked (kept: a revocation announced on the log names them).
    revoked_keys: list[str] = msgspec.field(default_factory=list)
    # When a revoked host was last invited again (`readmit_host`): a revocation asked for on the
    # log before then is not applied again (grid.identity.admin.apply_requested_revocations).
    readmitted_at: float | None = None
    # Bumped by every revocation and readmission of the host: when controllers' records of it
    # disagree on whether it is revoked, the higher generation wins, and a tie is revoked
    # (grid.identity.shared_registry.merge_host).
    generation: int = 0


class Registry(msgspec.Struct):
    hosts: dict[str, HostIdentityRecord] = msgspec.field(default_factory=dict)
    # user public key -> unix seconds; JWTs of that key issued at or before it are refused.
    revocations: dict[str, int] = msgspec.field(default_factory=dict)


def _new_host_record(host_id: str) -> HostIdentityRecord:
    return HostIdentityRecord(command_consumer=new_host_consumer(host_id),
                              account_seed=create_account_pair().seed.decode())


def _load_seed(path: Path, create: Any) -> nkeys.KeyPair:
    if path.exists():
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise AuthorityError(f"{path} is readable by others (mode {mode:o}); chmod 600 it")
        return nkeys.from_seed(path.read_bytes().strip())
    pair = create()
    write_owner_only(path, pair.seed + b"\n")
    return nkeys.from_seed(path.read_bytes().strip())


def principal_from_claims(claims: dict[str, Any]) -> Principal | None:
    """The principal a user JWT of ours was issued for (its tags record it), else None."""
    return principal_from_tags(list(claims.get("nats", {}).get("tags") or []))


class Authority:
    """Holds the operator and account keys; issues user JWTs; keeps the revocation list."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.directory.chmod(0o700)
        self._operator = _load_seed(self.directory / "operator.nk", create_operator_pair)
        self._system = _load_seed(self.directory / "system.nk", create_account_pair)
        self._account = _load_seed(self.directory / "account.nk", create_account_pair)
        self._invitee = _load_seed(self.directory / "invitee.nk", create_account_pair)
        self._infer = _load_seed(self.directory / "infer.nk", create_account_pair)
        self._clients = {role: _load_seed(self.directory / f"{stem}.nk", create_account_pair)
                         for role, (_, stem) in accounts.CLIENT_ACCOUNTS.items()}
        self._registry_path = self.directory / "registry.json"
        self.registry = Registry()
        self.reload()

    def reload(self) -> None:
        """Read the registry again: `gridctl node revoke` changes it from another process."""
        if self._registry_path.exists():
            self.registry = msgspec.json.decode(self._registry_path.read_bytes(), type=Registry)
            # A registry written before hosts had accounts of their own: draw them, once.
            unaccounted = [record for record in self.registry.hosts.values() if record.account_seed is None]
            for record in unaccounted:
                record.account_seed = create_account_pair().seed.decode()
            if unaccounted:
                self._save()

    def update_registry(self, change: Callable[[Registry], Registry]) -> bool:
        """Read the registry again, apply `change` (a pure function: grid.identity.shared_registry
        merges what the other controllers wrote) and save the result if it differs. Returns
        whether it did."""
        self.reload()
        updated = change(self.registry)
        if updated == self.registry:
            return False
        self.registry = updated
        self._save()
        return True

    def record_secret(self) -> bytes:
        """The GRID account's seed: every controller of this grid holds it, nothing else does,
        so the key of the controllers' shared records is derived from it."""
        return bytes(self._account.seed)

    # ------------------------------------------------------------------ keys and JWTs
    @property
    def operator_public(self) -> str:
        return self._operator.public_key.decode()

    @property
    def account_public(self) -> str:
        return self._account.public_key.decode()

    @property
    def system_public(self) -> str:
        return self._system.public_key.decode()

    def operator_jwt(self, now: float) -> str:
        claims = jwt.operator_claims(self.operator_public, OPERATOR_NAME, system_account=self.system_public)
        return jwt.encode(claims, self._operator, issued_at=int(now))

    def system_account_jwt(self, now: float) -> str:
        claims = jwt.account_claims(self.system_public, SYSTEM_ACCOUNT_NAME, jetstream=False)
        return jwt.encode(claims, self._operator, issued_at=int(now))

    @property
    def invitee_account_public(self) -> str:
        return self._invitee.public_key.decode()

    @property
    def infer_account_public(self) -> str:
        return self._infer.public_key.decode()

    def account_jwt(self, now: float) -> str:
        """GRID: JetStream and its exports to hosts and invitees. The same for the grid's whole
        life (grid.identity.accounts says why it must never change), and no user of GRID is ever
        revoked (hosts and invitees are not in it)."""
        claims = jwt.account_claims(self.account_public, ACCOUNT_NAME, jetstream=True,
                                    exports=accounts.grid_exports())
        return jwt.encode(claims, self._operator, issued_at=int(now))

    def infer_account_jwt(self, now: float) -> str:
        """INFER: an import of each unrevoked host's inference service, for the gateways."""
        hosts = [(host_id, self.host_account_public(host_id)) for host_id in sorted(self.registry.hosts)
                 if not self.host_revoked(host_id)]
        claims = jwt.account_claims(self.infer_account_public, INFER_ACCOUNT_NAME, jetstream=False,
                                    imports=accounts.infer_imports(hosts))
        return jwt.encode(claims, self._operator, issued_at=int(now))

    def client_account_public(self, role: Role) -> str:
        return self._clients[role].public_key.decode()

    def client_account_jwts(self, now: float) -> list[AccountJWT]:
        """GATEWAYS, OPERATORS, READERS: each imports what its role reaches in GRID. The same for
        the grid's whole life, like GRID's (their users are never revoked either)."""
        out = []
        for role, (name, _) in accounts.CLIENT_ACCOUNTS.items():
            claims = jwt.account_claims(self.client_account_public(role), name, jetstream=False,
                                        imports=accounts.client_account_imports(role, self.account_public))
            out.append(AccountJWT(self.client_account_public(role), jwt.encode(claims, self._operator,
                                                                               issued_at=int(now))))
        return out

    def invitee_account_jwt(self, now: float) -> str:
        host_keys = self._host_keys()
        revocations = {k: at for k, at in self.registry.revocations.items() if k not in host_keys}
        claims = jwt.account_claims(self.invitee_account_public, INVITEE_ACCOUNT_NAME, jetstream=False,
                                    revocations=revocations,
                                    imports=accounts.invitee_account_imports(self.account_public))
        return jwt.encode(claims, self._operator, issued_at=int(now))

    def _host_account(self, host_id: str) -> nkeys.KeyPair:
        seed = self.registry.hosts[host_id].account_seed
        assert seed is not None  # drawn with the record, or by `reload` for an older registry
        return nkeys.from_seed(seed.encode())

    def host_account_public(self, host_id: str) -> str:
        return self._host_account(host_id).public_key.decode()

    def host_account_jwt(self, host_id: str, now: float) -> str:
        record = self.registry.hosts[host_id]
        principal = Principal(Role.HOST, host_id=host_id, command_consumer=record.command_consumer)
        mine = set(record.keys) | set(record.revoked_keys)
        revocations = {k: at for k, at in self.registry.revocations.items() if k in mine}
        claims = jwt.account_claims(self.host_account_public(host_id), f"host {host_id}", jetstream=False,
                                    revocations=revocations,
                                    imports=accounts.host_account_imports(principal, self.account_public),
                                    exports=accounts.host_account_exports(host_id))
        return jwt.encode(claims, self._operator, issued_at=int(now))

    def _host_keys(self) -> set[str]:
        return {k for record in self.registry.hosts.values() for k in (*record.keys, *record.revoked_keys)}

    def host_account_update(self, host_id: str, *, now: float) -> AccountJWT:
        return AccountJWT(self.host_account_public(host_id), self.host_account_jwt(host_id, now))

    def infer_account_update(self, *, now: float) -> AccountJWT:
        return AccountJWT(self.infer_account_public, self.infer_account_jwt(now))

    def admission_updates(self, host_ids: Sequence[str], *, now: float) -> list[AccountJWT]:
        """What the servers must hold once these hosts connect: their accounts (before they
        connect: the server admits no user of an account it does not know), and INFER with an
        import of each one's inference service."""
        return [*(self.host_account_update(h, now=now) for h in host_ids), self.infer_account_update(now=now)]

    def all_account_jwts(self, now: float) -> list[AccountJWT]:
        """Every account of this grid but SYS, as of now: what a server config preloads, and what
        a controller hands the servers at start where they hold something else
        (`sync_account_jwts`), so a server that missed a push catches up."""
        self.reload()
        return [AccountJWT(self.account_public, self.account_jwt(now)),
                AccountJWT(self.invitee_account_public, self.invitee_account_jwt(now)),
                *self.client_account_jwts(now),
                *self.admission_updates(sorted(self.registry.hosts), now=now)]

    def issue(self, principal: Principal, user_public_key: str, *, now: float,
              ttl_seconds: float | None) -> str:
        """A user JWT for `user_public_key` carrying `principal`'s permissions."""
        if not user_public_key.startswith("U"):
            raise AuthorityError("not a user public key")
        try:
            keypair_from_pubkey(user_public_key.encode())
        except (nkeys.NkeysError, ValueError) as exc:
            raise AuthorityError("not a user public key") from exc
        if principal.host_id is not None:
            if self.host_revoked(principal.host_id):
                raise AuthorityError(f"host {principal.host_id} is revoked")
            principal = self.host_principal(principal.host_id)
        token = self._user_token(principal, user_public_key, now=now, ttl_seconds=ttl_seconds)
        if principal.host_id is not None:
            record = self.registry.hosts[principal.host_id]
            if user_public_key not in record.keys:
                record.keys.append(user_public_key)
                self._save()
        return token

    def issue_host_creds(self, host_ids: Sequence[str], *, now: float,
                         ttl_seconds: float | None) -> dict[str, tuple[str, bytes]]:
        """A fresh user key and JWT (token, seed) for each of many hosts, with one registry read
        and one write: `issue` reads and writes the registry per host, which is quadratic in
        the number of hosts when a fleet is enrolled at once."""
        self.reload()
        revoked = [host_id for host_id in host_ids if self.host_revoked(host_id)]
        if revoked:  # refused before anything is issued
            raise AuthorityError(f"host {revoked[0]} is revoked")
        issued: dict[str, tuple[str, bytes]] = {}
        for host_id in host_ids:
            record = self.registry.hosts.get(host_id)
            if record is None:
                record = self.registry.hosts[host_id] = _new_host_record(host_id)
            pair = create_user_pair()
            public = pair.public_key.decode()
            principal = Principal(Role.HOST, host_id=host_id, command_consumer=record.command_consumer)
            issued[host_id] = (self._user_token(principal, public, now=now, ttl_seconds=ttl_seconds), pair.seed)
            record.keys.append(public)
        self._save()
        return issued

    def issuer_public(self, principal: Principal) -> str:
        """The account `principal`'s credentials are issued in (a JWT's `iss`)."""
        return self._issuer(principal).public_key.decode()

    def _issuer(self, principal: Principal) -> nkeys.KeyPair:
        """The account a principal's users live in (grid.identity.accounts)."""
        if principal.role is Role.HOST:
            assert principal.host_id is not None
            return self._host_account(principal.host_id)
        if principal.role in self._clients:
            return self._clients[principal.role]
        return self._invitee if principal.role is Role.INVITEE else self._account

    def _user_token(self, principal: Principal, user_public_key: str, *, now: float,
                    ttl_seconds: float | None) -> str:
        grant = grant_for(principal, user_public_key)
        tags = principal_tags(principal)
        claims = jwt.user_claims(
            user_public_key,
            principal.label,
            pub_allow=list(grant.pub_allow),
            pub_deny=list(grant.pub_deny),
            sub_allow=list(grant.sub_allow),
            sub_deny=list(grant.sub_deny),
            allow_responses=grant.allow_responses,
            max_responses=grant.max_responses,
            response_ttl_seconds=grant.response_ttl_seconds,
            max_payload=grant.max_payload,
            expires_at=None if ttl_seconds is None else int(now + ttl_seconds),
            tags=tags,
        )
        # The compact proof its holder signs log messages with (grid.identity.signing): the JWT
        # itself, with its permission lists, would add kilobytes to every message.
        claims[signing.CERT_CLAIM] = signing.certify(self._account, user_public_key, principal,
                                                     issued_at=int(now), expires_at=claims.get("exp"))
        # The grid's account, which signs every certificate: a host's or an invitee's JWT is
        # issued by an account of its own, so its `iss` does not name it.
        claims[signing.GRID_ACCOUNT_CLAIM] = self.account_public
        if principal.role is Role.GATEWAY:
            claims[INFER_JWT_CLAIM] = self._infer_user_token(user_public_key, now=now, expires_at=claims.get("exp"))
        return jwt.encode(claims, self._issuer(principal), issued_at=int(now))

    def _infer_user_token(self, user_public_key: str, *, now: float, expires_at: int | None) -> str:
        """The same key's user JWT in INFER: what a gateway sends inference requests as. It may
        publish requests to hosts and read its own inbox, nothing else."""
        grant = accounts.infer_grant(user_public_key)
        claims = jwt.user_claims(
            user_public_key, "gateway (inference)", pub_allow=list(grant.pub_allow), pub_deny=list(grant.pub_deny),
            sub_allow=list(grant.sub_allow), sub_deny=list(grant.sub_deny), allow_responses=grant.allow_responses,
            expires_at=expires_at,
        )
        return jwt.encode(claims, self._infer, issued_at=int(now))

    def issue_creds(self, principal: Principal, path: Path, *, now: float,
                    ttl_seconds: float | None) -> Path:
        """A fresh user key and a creds file for a process on this machine (the key is made here)."""
        pair = create_user_pair()
        token = self.issue(principal, pair.public_key.decode(), now=now, ttl_seconds=ttl_seconds)
        return write_creds(path, token, pair.seed)

    def host_principal(self, host_id: str) -> Principal:
        """The host's principal, with its command consumer's name (drawn on first use)."""
        self.reload()  # read what another process (the controller, `gridctl node revoke`) wrote
        record = self.registry.hosts.get(host_id)
        if record is None:
            record = self.registry.hosts[host_id] = _new_host_record(host_id)
            self._save()
        return Principal(Role.HOST, host_id=host_id, command_consumer=record.command_consumer)

    def admitted_hosts(self) -> list[Principal]:
        """Every admitted, unrevoked host's principal, sorted by host id, from one registry read
        (`host_principal` reads the registry per call)."""
        self.reload()
        return [Principal(Role.HOST, host_id=host_id, command_consumer=self.registry.hosts[host_id].command_consumer)
                for host_id in sorted(self.registry.hosts) if not self.host_revoked(host_id)]

    def verify_user(self, user_jwt: str) -> dict[str, Any]:
        """Claims of a user JWT this authority signed, by the account its principal lives in
        (signature checked, expiry not)."""
        principal = principal_from_claims(jwt.decode(user_jwt))
        if principal is not None and principal.host_id is not None:
            self.reload()
            if principal.host_id not in self.registry.hosts:
                raise jwt.JWTError("no such host")
            return jwt.verify(user_jwt, self.host_account_public(principal.host_id))
        issuer = self._issuer(principal) if principal is not None else self._account
        return jwt.verify(user_jwt, issuer.public_key.decode())

    # ------------------------------------------------------------------ revocation
    def host_revoked(self, host_id: str) -> bool:
        record = self.registry.hosts.get(host_id)
        return record is not None and record.revoked_at is not None

    def key_revoked(self, user_public_key: str, issued_at: int) -> bool:
        at = self.registry.revocations.get(user_public_key)
        return at is not None and issued_at <= at

    def revoke_host(self, host_id: str, *, now: float,
                    longest_ttl_seconds: float = HOST_CREDENTIAL_TTL_SECONDS) -> list[AccountJWT]:
        """Revoke every key issued to `host_id`; returns the account JWTs to push to the servers
        (the host's, with its keys revoked, and INFER's, without its inference import).
        The keys revoked stay listed in the host's record (`revoked_keys`, every one this host
        ever lost): the revocation on the log names them."""
        self.reload()
        self.host_principal(host_id)
        record = self.registry.hosts[host_id]
        record.revoked_at = int(now)
        record.generation += 1
        for key in record.keys:
            self.registry.revocations[key] = int(now)
        record.revoked_keys = sorted(set(record.revoked_keys) | set(record.keys))
        record.keys = []
        self.prune_revocations(now=now, longest_ttl_seconds=longest_ttl_seconds)
        self._save()
        return [self.host_account_update(host_id, now=now), self.infer_account_update(now=now)]

    def revoke_key(self, user_public_key: str, *, now: float,
                   longest_ttl_seconds: float = HOST_CREDENTIAL_TTL_SECONDS) -> list[AccountJWT]:
        """Revoke one invitee key (every JWT of it issued up to `now`) once its join is done.
        Returns the account JWT to push to the servers."""
        self.reload()
        self.registry.revocations[user_public_key] = int(now)
        self.prune_revocations(now=now, longest_ttl_seconds=longest_ttl_seconds)
        self._save()
        return [AccountJWT(self.invitee_account_public, self.invitee_account_jwt(now))]

    def prune_revocations(self, *, now: float, longest_ttl_seconds: float = HOST_CREDENTIAL_TTL_SECONDS) -> int:
        """Forget revocations older than the longest credential lifetime: every JWT they refuse
        was issued before them and has expired since, so the server refuses it anyway (and the
        account JWT every server holds stays small). Returns how many were dropped."""
        cutoff = now - longest_ttl_seconds
        stale = [key for key, at in self.registry.revocations.items() if at < cutoff]
        for key in stale:
            del self.registry.revocations[key]
        return len(stale)

    def readmit_host(self, host_id: str, *, now: float | None = None) -> None:
        """A new invitation for a revoked host id: its old keys stay revoked, new ones are valid,
        and it reads its commands through a new consumer (the revoked key knew the old name)."""
        self.reload()
        record = self.registry.hosts.get(host_id)
        if record is not None and record.revoked_at is not None:
            record.revoked_at = None
            record.generation += 1
            record.readmitted_at = time.time() if now is None else now
            record.command_consumer = new_host_consumer(host_id)
            self._save()

    def _save(self) -> None:
        write_owner_only(self._registry_path, msgspec.json.encode(self.registry))

    # ------------------------------------------------------------------ server side
    def system_creds(self, *, now: float) -> Path:
        """A SYS-account user allowed only to look up and push account claims (and read its replies),
        in a file of its own: two processes pushing at once (the controller revoking a spent
        invitee, `gridctl node revoke` on its machine) each connect with the key their inbox
        was derived from. One file rewritten per call let one process read the other's key and
        wait for replies on an inbox the server would not deliver to."""
        self._prune_system_creds(time.time())
        pair = create_user_pair()
        public = pair.public_key.decode()
        path = self.directory / f"{SYSTEM_CREDS_PREFIX}{public[1:17].lower()}.creds"
        claims = jwt.user_claims(
            public, "grid-claims-pusher",
            pub_allow=["$SYS.REQ.CLAIMS.UPDATE", "$SYS.REQ.ACCOUNT.*.CLAIMS.UPDATE",
                       "$SYS.REQ.ACCOUNT.*.CLAIMS.LOOKUP"],
            pub_deny=[], sub_allow=[f"_INBOX.{public}.>"], sub_deny=[],
            allow_responses=False, expires_at=None,
        )
        return write_creds(path, jwt.encode(claims, self._system, issued_at=int(now)), pair.seed)

    def _prune_system_creds(self, now: float) -> None:
        """Remove the claims pushers' files older than SYSTEM_CREDS_KEEP_SECONDS (a push holds its
        connection for seconds) and the single file older versions rewrote."""
        stale = [self.directory / "system.creds", *self.directory.glob(f"{SYSTEM_CREDS_PREFIX}*.creds")]
        for path in stale:
            try:
                if path.name == "system.creds" or now - path.stat().st_mtime > SYSTEM_CREDS_KEEP_SECONDS:
                    path.unlink()
            except FileNotFoundError:
                continue

    def server_config(self, *, now: float, resolver_dir: Path | None = None, make_resolver_dir: bool = True) -> str:
        """The nats-server configuration lines that turn on operator mode for this grid.
        `make_resolver_dir` False: the directory is a path on another machine (nats-server makes
        it, owner-only, when it starts)."""
        resolver = Path(resolver_dir) if resolver_dir is not None else self.directory / "resolver"
        if make_resolver_dir:
            resolver.mkdir(parents=True, exist_ok=True, mode=0o700)
        return (
            f"operator: {self.operator_jwt(now)}\n"
            f"system_account: {self.system_public}\n"
            "resolver: {\n"
            "  type: full\n"
            f"  dir: \"{resolver}\"\n"
            "  allow_delete: false\n"
            "  interval: \"2m\"\n"
            "}\n"
            "resolver_preload: {\n"
            f"  {self.system_public}: {self.system_account_jwt(now)}\n"
            + "".join(f"  {update.account}: {update.token}\n" for update in self.all_account_jwts(now))
            + "}\n"
        )

    def write_server_config(self, *, now: float, resolver_dir: Path | None = None) -> Path:
        path = self.directory / "nats-auth.conf"
        write_owner_only(path, self.server_config(now=now, resolver_dir=resolver_dir).encode())
        return path


async def push_account_jwts(nc: Any, updates: Sequence[AccountJWT], *, timeout: float = 5.0) -> None:
    """`push_account_jwt` for each update, in order (a host's account before INFER's import of it)."""
    for update in updates:
        await push_account_jwt(nc, update.account, update.token, timeout=timeout)


def _same_account(stored: str, wanted: str) -> bool:
    """Whether two account JWTs say the same (whenever each was signed)."""
    def content(token: str) -> dict[str, Any]:
        claims = jwt.decode(token)
        return {k: v for k, v in claims.items() if k not in ("iat", "jti")}
    try:
        return content(stored) == content(wanted)
    except jwt.JWTError:
        return False


async def sync_account_jwts(nc: Any, updates: Sequence[AccountJWT], *, timeout: float = 5.0) -> list[str]:
    """Push each update the servers do not already hold, as the system account; returns the
    accounts pushed. An account JWT that changes drops the answers still on their way out of
    that account's services (grid.identity.accounts), so an unchanged one is never pushed again."""
    pushed = []
    for update in updates:
        try:
            reply = await nc.request(f"$SYS.REQ.ACCOUNT.{update.account}.CLAIMS.LOOKUP", b"", timeout=timeout)
            stored = reply.data.decode()
        except Exception:  # noqa: BLE001 (an unknown account, or no answer: push it)
            stored = ""
        if not _same_account(stored, update.token):
            await push_account_jwt(nc, update.account, update.token, timeout=timeout)
            pushed.append(update.account)
    return pushed


async def push_account_jwt(nc: Any, account_public: str, account_jwt: str, *, timeout: float = 5.0) -> None:
    """Hand an operator-signed account JWT to every server of the cluster (system account user)."""
    reply = await nc.request(f"$SYS.REQ.ACCOUNT.{account_public}.CLAIMS.UPDATE", account_jwt.encode(),
                             timeout=timeout)
    answer = msgspec.json.decode(reply.data)
    data = answer.get("data") or {}
    error = answer.get("error")
    if error or data.get("code") != 200:
        raise AuthorityError(f"account update refused: {error or data}")
