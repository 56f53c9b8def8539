"""The join and renewal exchange: a host proves it holds its own key and receives a host JWT.

Where it runs: a NATS request/reply service of the controller on `grid.enrol.join` and
`grid.enrol.renew`, not an HTTP endpoint. A joining machine must reach the NATS listener anyway
(it is the only port a host needs), its TLS certificate is the one the join token pins, and the
only thing a token's invitee credential may do there is publish a join request; an HTTP
endpoint would be a second internet-facing listener, with its own TLS and its own exposure,
for one request per machine. Several controllers may serve it (a queue group): redeeming an
invitation is a compare-and-set on the invitation store.

The proof of possession needs one round trip: the host signs, with the nkey it generated (whose
seed never leaves it), a statement binding the invitation (by the hash of its secret), its
public key and a nonce of its own. A captured request is worthless: the invitation is single
use, and the JWT it would yield is bound to a key the captor does not hold. Renewal is the
same with the current (unexpired, unrevoked) JWT in place of the invitation, and a signing time
that must be fresh.

Whom it answers: every request is also signed as the requester's NATS identity (the invitee's
credential inside the token, or the host's own), like a log message (grid.identity.signing), and
the service answers only on a reply subject under that identity's inbox, or one the server made
up for a request from another account (grid.identity.replies): otherwise a reply subject such as
`grid.cmd.<host>` would have the controller store its answer in a stream. Anything else gets no
answer, a warning and a count. Invitees and hosts live in accounts of their own
(grid.identity.accounts), so their requests always arrive with such a reply, and the answer is
signed for the request's subject instead.

The invitee credential dies with its join: once the invitation is spent (admitted, or refused as
used, expired or unknown) the service revokes the invitee's key and pushes the account JWT to
the servers, so the token is worthless from then on, not for the rest of its lifetime.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
import nats
import nats.errors
import nkeys
import structlog
from nats_jwt.nkeys_ext import create_user_pair, keypair_from_pubkey

from grid.identity import jwt
from grid.identity.accounts import AccountJWT
from grid.identity.authority import (
    HOST_CREDENTIAL_TTL_SECONDS,
    Authority,
    AuthorityError,
    principal_from_claims,
    push_account_jwts,
    sync_account_jwts,
)
from grid.identity.creds import connect_options, read_creds, write_creds
from grid.identity.invitations import (
    INVITATION_TTL_SECONDS,
    REFUSED_INVITATION_EXPIRED,
    REFUSED_INVITATION_USED,
    REFUSED_UNKNOWN_INVITATION,
    Invitation,
    InvitationStore,
    JoinToken,
    secret_hash,
)
from grid.identity.permissions import ENROL_JOIN_SUBJECT, ENROL_RENEW_SUBJECT, Principal, Role, inbox_prefix
from grid.identity.replies import RequestCheck, check_request
from grid.identity.signing import Signer, Verifier, grid_account
from grid.identity.tls import pinned_tls_context
from grid.secrets import write_owner_only
from grid.transport.nats_failover import connect_client

log = structlog.get_logger(__name__)

# No queue group: every controller receives every join and renewal, and only the one `answering`
# says is in charge (the lease holder) answers. A queue group handed each request to one of them at
# random, and a standby, whose invitations and registry are not the active controller's, refused
# half of the joins as unknown invitations (and revoked the invitee, spending the token).
# A host renews once two thirds of its credential's lifetime have passed: with the 24 h default
# that leaves 8 h of retries before the server disconnects it.
RENEW_AT_FRACTION = 2 / 3
RENEW_CLOCK_SKEW_SECONDS = 120.0
REQUEST_TIMEOUT_SECONDS = 10.0

REFUSED_MALFORMED = "malformed_request"
REFUSED_BAD_PROOF = "bad_proof"
REFUSED_HOST_REVOKED = "host_revoked"
REFUSED_NOT_A_HOST_CREDENTIAL = "not_a_host_credential"
REFUSED_CREDENTIAL_EXPIRED = "credential_expired"
REFUSED_CREDENTIAL_REVOKED = "credential_revoked"
REFUSED_STALE_PROOF = "stale_proof"
# The host's side: an answer no controller of the grid provably wrote (it is not trusted).
REFUSED_UNPROVEN_REPLY = "unproven_reply"
# The server refused the token's own credential: it was used (one machine per invitation),
# expired, or revoked.
REFUSED_INVITEE_REFUSED = "invitation_used_expired_or_revoked"
# Join refusals after which the invitation can never be redeemed: its invitee is revoked.
SPENT_INVITATION = frozenset({REFUSED_INVITATION_USED, REFUSED_INVITATION_EXPIRED, REFUSED_UNKNOWN_INVITATION})
PUSH_TIMEOUT_SECONDS = 5.0
# How long after a join's answer its invitee is revoked. On a cluster the answer crosses a route
# to the invitee's server while the revocation goes out to every server over the system account:
# revoked at once, the invitee's connection was sometimes dropped with the answer still on its
# way (seen on a 3-node cluster: the join timed out, and every retry found the invitation spent).
INVITEE_REVOKE_GRACE_SECONDS = 1.0


class EnrolmentRefused(msgspec.Struct, frozen=True):
    """The service said no; `reason` is one of the REFUSED_* constants."""

    reason: str


class JoinRequest(msgspec.Struct, frozen=True):
    secret: str
    public_key: str
    nonce: str
    signature: str


class RenewRequest(msgspec.Struct, frozen=True):
    jwt: str
    nonce: str
    signed_at: float
    signature: str


class Granted(msgspec.Struct, frozen=True):
    host_id: str
    command_consumer: str
    jwt: str
    expires_at: float
    ca_pem: str | None = None
    failure_domain: str | None = None
    tags: tuple[str, ...] = ()
    dedicated: bool = False


class Reply(msgspec.Struct, frozen=True):
    granted: Granted | None = None
    refused: str | None = None


def join_statement(secret: str, public_key: str, nonce: str) -> bytes:
    return f"grid-join\n{secret_hash(secret)}\n{public_key}\n{nonce}".encode()


def renew_statement(current_jwt: str, nonce: str, signed_at: float) -> bytes:
    return f"grid-renew\n{current_jwt}\n{nonce}\n{signed_at!r}".encode()


def _sign(pair: nkeys.KeyPair, statement: bytes) -> str:
    return base64.b64encode(pair.sign(statement)).decode()


def _signed_by(public_key: str, statement: bytes, signature: str) -> bool:
    try:
        keypair_from_pubkey(public_key.encode()).verify(statement, base64.b64decode(signature))
    except (nkeys.NkeysError, ValueError):
        return False
    return True


class EnrolmentService:
    """Answers join and renewal requests for one authority (the controller runs it)."""

    def __init__(
        self,
        authority: Authority,
        invitations: InvitationStore,
        *,
        clock: Callable[[], float] = time.time,
        host_ttl_seconds: float = HOST_CREDENTIAL_TTL_SECONDS,
        ca_pem: str | None = None,
        on_admitted: Callable[[Principal], Awaitable[None]] | None = None,
        push: Callable[[Sequence[AccountJWT]], Awaitable[None]] | None = None,
        sign: Callable[[str, bytes], dict[str, str]] | None = None,
        on_changed: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.authority = authority
        # Signs each answer as the controller (its log's authorship): the host trusts only that.
        self.sign = sign
        # Checks who signed a request (the grid's own credentials only).
        self.verifier = Verifier(authority.account_public)
        self.invitations = invitations
        self.clock = clock
        self.host_ttl_seconds = host_ttl_seconds
        self.ca_pem = ca_pem
        # Whether this service answers at all (a standby controller stays silent): see serve.
        self.answering: Callable[[], bool] = lambda: True
        # Set up what the host may not set up itself (its command consumer) before it connects.
        self.on_admitted = on_admitted
        # Told after a join, a renewal or an invitee's revocation changed the registry or the
        # invitations: the controllers share them (grid.identity.shared_registry).
        self.on_changed = on_changed
        # Hands account JWTs (a new host's account, a revocation) to the servers; default: over a
        # system account connection to the server `serve` is connected to.
        self.push = push
        # Requests answered with nothing, by reason (grid.identity.replies).
        self.refused_requests: dict[str, int] = {}
        # Invitee keys revoked after their join, and revocations that could not be pushed.
        self.invitees_revoked = 0
        self.revoke_failures = 0
        # New hosts' accounts that could not be handed to the servers.
        self.push_failures = 0
        self._nc: Any = None
        self._subs: list[Any] = []
        # Invitee revocations waiting out INVITEE_REVOKE_GRACE_SECONDS.
        self._revoking: set[asyncio.Task[None]] = set()

    def invite(self, host_id: str, *, servers: tuple[str, ...], tls_fingerprint: str | None,
               ttl_seconds: float = INVITATION_TTL_SECONDS, failure_domain: str | None = None,
               tags: tuple[str, ...] = (), dedicated: bool = False) -> tuple[Invitation, JoinToken]:
        now = self.clock()
        invitation, secret = self.invitations.create(
            host_id, now=now, ttl_seconds=ttl_seconds, failure_domain=failure_domain, tags=tags,
            dedicated=dedicated,
        )
        invitee = create_user_pair()
        invitee_jwt = self.authority.issue(Principal(Role.INVITEE), invitee.public_key.decode(), now=now,
                                           ttl_seconds=ttl_seconds)
        token = JoinToken(servers=servers, secret=secret, tls_fingerprint=tls_fingerprint,
                          invitee_jwt=invitee_jwt, invitee_seed=invitee.seed.decode())
        return invitation, token

    def _grant(self, host_id: str, public_key: str, now: float, invitation: Invitation | None) -> Granted:
        principal = self.authority.host_principal(host_id)
        token = self.authority.issue(principal, public_key, now=now, ttl_seconds=self.host_ttl_seconds)
        assert principal.command_consumer is not None
        return Granted(
            host_id=host_id, command_consumer=principal.command_consumer, jwt=token, expires_at=now + self.host_ttl_seconds, ca_pem=self.ca_pem,
            failure_domain=invitation.failure_domain if invitation else None,
            tags=invitation.tags if invitation else (), dedicated=invitation.dedicated if invitation else False,
        )

    def handle_join(self, data: bytes) -> tuple[Reply, Principal | None]:
        """The reply to one join request, and the host admitted (None when refused)."""
        now = self.clock()
        self.authority.reload()  # `gridctl node revoke` may have changed it in another process
        try:
            request = msgspec.json.decode(data, type=JoinRequest)
        except msgspec.DecodeError:
            return Reply(refused=REFUSED_MALFORMED), None
        if not request.public_key.startswith("U") or not _signed_by(
            request.public_key, join_statement(request.secret, request.public_key, request.nonce), request.signature
        ):
            return Reply(refused=REFUSED_BAD_PROOF), None
        outcome = self.invitations.redeem(request.secret, now=now)
        if isinstance(outcome, str):
            return Reply(refused=outcome), None
        # The operator invited this host id again after revoking it: its old keys stay revoked.
        self.authority.readmit_host(outcome.host_id, now=now)
        try:
            granted = self._grant(outcome.host_id, request.public_key, now, outcome)
        except AuthorityError:
            return Reply(refused=REFUSED_BAD_PROOF), None
        return Reply(granted=granted), self.authority.host_principal(outcome.host_id)

    def handle_renew(self, data: bytes) -> Reply:
        now = self.clock()
        self.authority.reload()  # a revocation made by `gridctl node revoke` refuses renewal at once
        try:
            request = msgspec.json.decode(data, type=RenewRequest)
            claims = self.authority.verify_user(request.jwt)
        except (msgspec.DecodeError, jwt.JWTError):
            return Reply(refused=REFUSED_MALFORMED)
        principal = principal_from_claims(claims)
        if principal is None or principal.role is not Role.HOST or principal.host_id is None:
            return Reply(refused=REFUSED_NOT_A_HOST_CREDENTIAL)
        public_key = str(claims["sub"])
        if not _signed_by(public_key, renew_statement(request.jwt, request.nonce, request.signed_at),
                          request.signature):
            return Reply(refused=REFUSED_BAD_PROOF)
        if abs(now - request.signed_at) > RENEW_CLOCK_SKEW_SECONDS:
            return Reply(refused=REFUSED_STALE_PROOF)
        if self.authority.host_revoked(principal.host_id):
            return Reply(refused=REFUSED_HOST_REVOKED)
        if self.authority.key_revoked(public_key, int(claims.get("iat", 0))):
            return Reply(refused=REFUSED_CREDENTIAL_REVOKED)
        if "exp" in claims and int(claims["exp"]) <= now:
            return Reply(refused=REFUSED_CREDENTIAL_EXPIRED)
        return Reply(granted=self._grant(principal.host_id, public_key, now, None))

    def check(self, msg: Any, role: Role) -> RequestCheck:
        """Whether to answer `msg` at all: signed by a credential of `role` of this grid, with its
        reply under that credential's inbox. A refusal is logged and counted here."""
        # Judged at the real time, as the server judged the credential when it connected (the
        # service's clock decides invitations and renewals).
        check = check_request(self.verifier, msg.subject, msg.data, msg.headers, msg.reply, roles=(role,))
        if not check.ok:
            self.refused_requests[check.reason] = self.refused_requests.get(check.reason, 0) + 1
            log.warning("enrolment.request_refused", subject=msg.subject, reason=check.reason,
                        reply=msg.reply[:80] if msg.reply else None, signer=check.signed.signer or None,
                        role=check.signed.role or None)
        return check

    async def publish_all_accounts(self, nc: nats.NATS) -> None:
        """Hand the servers `nc` is connected to every account of the grid they hold otherwise
        (pushing an unchanged one would drop answers on their way: grid.identity.accounts)."""
        self._nc = nc
        try:
            async with self._system_connection() as system:
                pushed = await sync_account_jwts(system, self.authority.all_account_jwts(self.clock()),
                                                 timeout=PUSH_TIMEOUT_SECONDS)
        except Exception as exc:  # the servers keep what they had; each admission pushes again
            self.push_failures += 1
            log.warning("enrolment.account_sync_failed", error=f"{type(exc).__name__}: {exc}")
            return
        if pushed:
            log.info("enrolment.accounts_synced", pushed=len(pushed))

    async def publish_accounts(self, admitted: Principal) -> None:
        """Hand the servers the new host's account before it is told to connect (the server
        admits no user of an account it does not know), and INFER's import of its inference."""
        assert admitted.host_id is not None
        await self._publish(self.authority.admission_updates([admitted.host_id], now=self.clock()))

    async def _publish(self, updates: Sequence[AccountJWT]) -> None:
        try:
            await (self.push or self._push_over_system_account)(updates)
        except Exception as exc:  # the join stands; a controller start pushes every account again
            self.push_failures += 1
            log.warning("enrolment.account_push_failed", accounts=[u.account for u in updates],
                        error=f"{type(exc).__name__}: {exc}")

    async def revoke_invitee(self, user_public_key: str) -> None:
        """Revoke a spent invitation's invitee key and push the revocation to the servers (the
        server then refuses that credential, and drops a connection still holding it)."""
        try:
            updates = self.authority.revoke_key(user_public_key, now=self.clock())
            await (self.push or self._push_over_system_account)(updates)
        except Exception as exc:  # the join stands; the credential still dies with its token's TTL
            self.revoke_failures += 1
            log.warning("enrolment.invitee_revoke_failed", invitee=user_public_key, error=f"{type(exc).__name__}: {exc}")
            return
        self.invitees_revoked += 1
        log.info("enrolment.invitee_revoked", invitee=user_public_key)

    async def _push_over_system_account(self, updates: Sequence[AccountJWT]) -> None:
        """`push_account_jwts` as the system account, to the server `serve`'s connection uses
        (same TLS): the servers of a cluster share them among themselves."""
        async with self._system_connection() as system:
            await push_account_jwts(system, updates, timeout=PUSH_TIMEOUT_SECONDS)

    @contextlib.asynccontextmanager
    async def _system_connection(self) -> AsyncIterator[nats.NATS]:
        """A system account connection to the server `serve`'s connection uses (same TLS)."""
        nc = self._nc
        if nc is None or nc.connected_url is None:
            raise AuthorityError("not connected to a server to hand account updates to")
        url = nc.connected_url
        options = connect_options(self.authority.system_creds(now=self.clock()), None)
        if nc.options.get("tls") is not None:
            options["tls"] = nc.options["tls"]
            if nc.options.get("tls_hostname"):
                options["tls_hostname"] = nc.options["tls_hostname"]
        system = await connect_client(servers=[f"{url.scheme}://{url.netloc}"], name="grid-accounts",
                                      allow_reconnect=False, max_reconnect_attempts=0,
                                      connect_timeout=PUSH_TIMEOUT_SECONDS, **options)
        try:
            yield system
        finally:
            await system.close()

    async def serve(self, nc: nats.NATS) -> None:
        """Answer requests on `nc` (a controller connection) until `stop`, while `answering()`.

        Joins and renewals are answered by the controller in charge only: it holds the invitations
        `gridctl invite` made on its machine and the revocations applied there, so an answer never
        depends on which controller a request happened to reach."""
        self._nc = nc

        async def on_join(msg: Any) -> None:
            if not self.answering():
                return
            check = self.check(msg, Role.INVITEE)
            if not check.ok:
                return
            reply, admitted = self.handle_join(msg.data)
            if admitted is not None and self.on_admitted is not None:
                try:
                    await self.on_admitted(admitted)
                except Exception as exc:  # the credential stands; the consumer can be made later
                    log.warning("enrolment.provision_failed", host_id=admitted.host_id, error=str(exc))
            if admitted is not None:
                # Before the answer, so the host can connect as soon as it has its credential.
                await self.publish_accounts(admitted)
            if self.on_changed is not None and (admitted is not None or reply.refused in SPENT_INVITATION):
                # Before the answer too: another controller taking over then knows the host.
                await self.on_changed()
            log.info("enrolment.join", host_id=admitted.host_id if admitted else None, refused=reply.refused)
            await self._answer(nc, msg, reply)
            if admitted is not None or reply.refused in SPENT_INVITATION:
                # After the answer has had time to arrive: the server drops the invitee's
                # connection once it is revoked.
                await nc.flush()
                task = asyncio.get_running_loop().create_task(self._revoke_after_grace(check.signed.signer))
                self._revoking.add(task)
                task.add_done_callback(self._revoking.discard)

        async def on_renew(msg: Any) -> None:
            if not self.answering():
                return
            if not self.check(msg, Role.HOST).ok:
                return
            reply = self.handle_renew(msg.data)
            log.info("enrolment.renew", host_id=reply.granted.host_id if reply.granted else None,
                     refused=reply.refused)
            if reply.granted is not None and self.on_changed is not None:
                await self.on_changed()
            await self._answer(nc, msg, reply)

        self._subs = [
            await nc.subscribe(ENROL_JOIN_SUBJECT, cb=on_join),
            await nc.subscribe(ENROL_RENEW_SUBJECT, cb=on_renew),
        ]
        await nc.flush()

    async def _answer(self, nc: nats.NATS, msg: Any, reply: Reply) -> None:
        data = msgspec.json.encode(reply)
        # Signed for the request's subject, not the reply's: a request from a host or an invitee
        # crosses from its account into GRID, and its reply subject here is one the server made
        # up (`_R_.…`) and maps back to the requester's own inbox.
        headers = self.sign(msg.subject, data) if self.sign is not None else None
        await nc.publish(msg.reply, data, headers=headers)

    async def _revoke_after_grace(self, invitee: str) -> None:
        try:
            await asyncio.sleep(INVITEE_REVOKE_GRACE_SECONDS)
        finally:  # a stop cuts the grace short, never the revocation
            await self.revoke_invitee(invitee)
            if self.on_changed is not None:
                await self.on_changed()

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs = []
        for task in list(self._revoking):
            task.cancel()
        await asyncio.gather(*self._revoking, return_exceptions=True)


# ---------------------------------------------------------------------- the host's side
class Enrolment(msgspec.Struct, frozen=True):
    host_id: str
    command_consumer: str
    creds_path: str
    ca_path: str | None
    expires_at: float
    failure_domain: str | None
    tags: tuple[str, ...]
    dedicated: bool


def _server_address(url: str) -> tuple[str, int]:
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    return parts.hostname or "127.0.0.1", parts.port or 4222


def _pinned_context(servers: tuple[str, ...], fingerprint: str) -> Any:
    """The pinned TLS context from the first listed server that answers (a cluster's servers
    share one certificate): one server of the list down does not stop the join."""
    failures: list[str] = []
    for server in servers:
        try:
            return pinned_tls_context(*_server_address(server), fingerprint)
        except OSError as exc:
            failures.append(f"{server}: {type(exc).__name__}: {exc}")
    raise ConnectionError("no server of the token answered: " + "; ".join(failures))


def _decode_reply(msg: Any, credential_jwt: str, request_subject: str) -> Granted | EnrolmentRefused:
    """The service's answer, if a controller of the grid that issued `credential_jwt` signed it
    as the answer to a request on `request_subject` (the account key is pinned by the
    credential). Only the server writes to this connection's inbox: nobody else's answer lands here."""
    account = grid_account(jwt.decode(credential_jwt))
    verdict = Verifier(account).verify(request_subject, msg.data, msg.headers, at=time.time(),
                                       check_permission=False)
    if not verdict.ok or verdict.role != Role.CONTROLLER.value:
        log.warning("enrolment.unproven_reply", reason=verdict.reason or f"signed by a {verdict.role}")
        return EnrolmentRefused(REFUSED_UNPROVEN_REPLY)
    reply = msgspec.json.decode(msg.data, type=Reply)
    return reply.granted if reply.granted is not None else EnrolmentRefused(reply.refused or REFUSED_MALFORMED)


async def join(token: JoinToken | str, directory: Path, *,
               timeout: float = REQUEST_TIMEOUT_SECONDS) -> Enrolment | EnrolmentRefused:
    """Join with a token: make this host's key here, prove it, and store the host credential.

    Writes `host.creds` (JWT and seed, 0600) and `ca.pem` under `directory` (0700); writes
    nothing when refused."""
    if isinstance(token, str):
        token = JoinToken.decode(token)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    directory.chmod(0o700)
    pair = create_user_pair()
    public_key = pair.public_key.decode()
    nonce = secrets.token_hex(16)
    request = JoinRequest(secret=token.secret, public_key=public_key, nonce=nonce,
                          signature=_sign(pair, join_statement(token.secret, public_key, nonce)))
    invitee = nkeys.from_seed(token.invitee_seed.encode())
    body = msgspec.json.encode(request)
    # Signed as the invitee: the service answers only under that credential's inbox.
    headers = Signer(token.invitee_jwt, token.invitee_seed).sign(ENROL_JOIN_SUBJECT, body)
    options: dict[str, Any] = {
        "user_jwt_cb": lambda: token.invitee_jwt.encode(),
        "signature_cb": lambda server_nonce: base64.b64encode(invitee.sign(server_nonce.encode())),
        "inbox_prefix": inbox_prefix(jwt.decode(token.invitee_jwt)["sub"]),
    }
    if token.tls_fingerprint is not None:
        options["tls"] = _pinned_context(token.servers, token.tls_fingerprint)
    try:
        nc = await connect_client(servers=list(token.servers), name="grid-join", allow_reconnect=False,
                                  max_reconnect_attempts=0, connect_timeout=timeout, **options)
    except nats.errors.Error as exc:
        if any(word in str(exc).lower() for word in ("authorization violation", "expired")):
            # The invitee credential dies with its join (and with its invitation's end).
            return EnrolmentRefused(REFUSED_INVITEE_REFUSED)
        raise
    try:
        reply = await nc.request(ENROL_JOIN_SUBJECT, body, timeout=timeout, headers=headers)
    finally:
        await nc.close()
    granted = _decode_reply(reply, token.invitee_jwt, ENROL_JOIN_SUBJECT)
    if isinstance(granted, EnrolmentRefused):
        return granted
    creds_path = write_creds(directory / "host.creds", granted.jwt, pair.seed)
    ca_path = None
    if granted.ca_pem is not None:
        ca_path = directory / "ca.pem"
        write_owner_only(ca_path, granted.ca_pem.encode())
    return Enrolment(host_id=granted.host_id, command_consumer=granted.command_consumer, creds_path=str(creds_path), ca_path=str(ca_path) if ca_path else None,
                     expires_at=granted.expires_at, failure_domain=granted.failure_domain,
                     tags=granted.tags, dedicated=granted.dedicated)


async def renew(nc: nats.NATS, creds_path: Path, *, now: float | None = None,
                timeout: float = REQUEST_TIMEOUT_SECONDS) -> float | EnrolmentRefused:
    """Renew the host credential in `creds_path` over `nc` (connected with it); rewrites the file
    in place (the client reads it again on its next reconnect) and returns the new expiry."""
    current_jwt, seed = read_creds(Path(creds_path))
    pair = nkeys.from_seed(seed.encode())
    nonce = secrets.token_hex(16)
    signed_at = time.time() if now is None else now
    request = RenewRequest(jwt=current_jwt, nonce=nonce, signed_at=signed_at,
                           signature=_sign(pair, renew_statement(current_jwt, nonce, signed_at)))
    body = msgspec.json.encode(request)
    # Signed as the host's credential: the service answers only under its inbox.
    headers = Signer(current_jwt, seed).sign(ENROL_RENEW_SUBJECT, body)
    reply = await nc.request(ENROL_RENEW_SUBJECT, body, timeout=timeout, headers=headers)
    granted = _decode_reply(reply, current_jwt, ENROL_RENEW_SUBJECT)
    if isinstance(granted, EnrolmentRefused):
        return granted
    write_creds(Path(creds_path), granted.jwt, seed)
    return granted.expires_at


def renewal_due(creds_path: Path, now: float) -> bool:
    """Whether the credential in `creds_path` should be renewed at `now`."""
    claims = jwt.decode(read_creds(Path(creds_path))[0])
    if "exp" not in claims:
        return False
    issued, expires = float(claims.get("iat", 0)), float(claims["exp"])
    return now >= issued + RENEW_AT_FRACTION * (expires - issued)
