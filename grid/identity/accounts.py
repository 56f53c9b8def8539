"""The NATS accounts of one grid, and exactly what crosses between them.

Why accounts. The server writes whatever a request asks it to answer (a JetStream API envelope,
a stream's PubAck to a plain publish, a status message) to the reply subject the *requester*
chose, and checks no permission on that subject. Inside one account, every credential with any
JetStream right, or any right to append, could therefore aim those answers at a stream subject
(`grid.ctl.mode`) and have the server store them there; enough of them push a subject's real
events out of its bounded history (a host erased a `ProfileSet`, a `ModeSet` and a revocation
that way). Signatures make such copies worthless to the folds, but cannot give the history back.
No subject permission can close it; an account boundary does: a reply subject names a subject
of the requester's own account, and the streams live in another.

The layout:
- GRID has JetStream (every stream, the lease bucket, the artifact store) and the controllers'
  credentials: the controller is the one role that writes the streams on its own authority.
- Each host has an account of its own, without JetStream, holding only that host's keys (and
  their revocations). It imports from GRID exactly the subjects in
  `grid.identity.permissions.host_imports` (its appends, from the ingress `grid.ingress.<id>.<kind>`
  under the names it appends on, so they reach no stream until a controller stores them:
  grid.controller.ingress; its reads of the log, its command
  consumer, the lease, the artifact store, renewal), the JetStream API under the local prefix
  `IMPORTED_JS_PREFIX`, and exports its inference service `grid.infer.<id>.>`. A request crossing
  an import carries a reply subject the server makes up (`_R_.…`) and maps back into the
  requester's account: whatever a host aims an answer at lands in its own account, where no
  stream listens and nothing of another host exists. A shared account for all hosts would not
  do: an answer aimed at another host's subject there would cross that host's import into GRID.
- GATEWAYS, OPERATORS and READERS hold the credentials of the grid's other processes (gateways;
  `gridctl` on an operator's machine; the analytics sink and dashboards), one account per role,
  without JetStream. Each imports from GRID exactly `grid.identity.permissions.client_imports`
  of its role: the appends the role makes (a gateway's request features on `grid.req.>`, an
  operator's control events on `grid.ctl.>` and artifact puts), and its reads, as stream infos
  and batched direct gets (grid.transport.direct_reads) under the local prefix. No consumer: its
  configuration names a deliver subject in GRID, which the server would fill. Like a host, a
  process there aims every answer at its own account, which holds only the role's own imports:
  a gateway could at most put a PubAck on a `grid.req` subject, which it may append to anyway,
  an operator on a `grid.ctl` subject (ditto), a reader nowhere. One account per role, not one
  for all three: an answer aimed at an import's subject crosses it, so a reader beside an
  operator could write control subjects that way.
- INFER imports every admitted host's inference service. A gateway sends inference requests
  through a second connection, in INFER, with the same key (its GRID credential carries that
  key's INFER JWT in the claim `INFER_JWT_CLAIM`).
- INVITEE holds the credentials inside join tokens: it imports the join service and nothing else.
- SYS is the server's system account (claims updates).

Why INFER is an account of its own: a new JWT for an account that *exports* a service drops the
answers still on their way back through it (measured: a host's pending command pull, an
invitee's join answer), so an account exporting to every host must never change. GRID's JWT is
the same for the grid's life; what changes with each admission and revocation is a host's own
account and INFER, which exports nothing. (Pushed only where the servers hold something else:
`grid.identity.authority.sync_account_jwts`.) The cost is one import per host in INFER's JWT
(some 200 bytes).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from grid.events.subjects import (
    ALL_STREAMS,
    ARTIFACT_STREAM,
    COMMANDS_STREAM,
    CONTROL_STREAM,
    HOSTS_STREAM,
    INGRESS_ROOT,
    LEASE_BUCKET,
)
from grid.identity.permissions import (
    CLIENT_ROLES,
    ENROL_JOIN_SUBJECT,
    ENROL_RENEW_SUBJECT,
    INFER_RESPONSE_TTL_SECONDS,
    INFER_ROOT,
    JS_API,
    Grant,
    Principal,
    Role,
    client_imports,
    host_imports,
    inbox_prefix,
    infer_subject_root,
    local_subject,
)

SERVICE = "service"
# The gateway credential's claim holding the same key's user JWT in INFER.
INFER_JWT_CLAIM = "grid_infer_jwt"
# Go durations, in nanoseconds, as the account JWT writes them.
_NS = 1_000_000_000
# How long after a pull request its messages may still come back across the import: longer than
# any fetch's expiry (grid.transport.jetstream_consumers waits at most a few seconds per fetch).
PULL_RESPONSE_SECONDS = 300
# A batched direct get is answered by many messages, within the reader's request timeout.
DIRECT_GET_RESPONSE_SECONDS = 60
# The account each client role's credentials live in: (name, the authority's seed file stem).
CLIENT_ACCOUNTS: dict[Role, tuple[str, str]] = {
    Role.GATEWAY: ("GATEWAYS", "gateways"),
    Role.OPERATOR: ("OPERATORS", "operators"),
    Role.READER: ("READERS", "readers"),
}


class AccountJWT(NamedTuple):
    """An operator-signed account JWT and the account it is for: what the servers are handed."""

    account: str
    token: str


def _service(subject: str, *, streamed_for: float | None = None) -> dict[str, Any]:
    export: dict[str, Any] = {"name": subject, "subject": subject, "type": SERVICE}
    if streamed_for is not None:
        # Answered by many messages (a pull batch, a streamed inference answer), for this long.
        export["response_type"] = "Stream"
        export["response_threshold"] = int(streamed_for * _NS)
    return export


def grid_exports() -> list[dict[str, Any]]:
    """GRID's services, wildcard over host and consumer: each host account imports the exact
    subjects of its own (`host_imports`), never these patterns."""
    singletons = (
        f"{INGRESS_ROOT}.*.*",
        f"{JS_API}.STREAM.MSG.GET.{HOSTS_STREAM}",
        f"{JS_API}.STREAM.MSG.GET.{CONTROL_STREAM}",
        f"{JS_API}.CONSUMER.INFO.{COMMANDS_STREAM}.*",
        f"$JS.ACK.{COMMANDS_STREAM}.*.>",
        f"{JS_API}.STREAM.INFO.KV_{LEASE_BUCKET}",
        f"{JS_API}.STREAM.MSG.GET.KV_{LEASE_BUCKET}",
        f"{JS_API}.STREAM.MSG.GET.{ARTIFACT_STREAM}",
        ENROL_RENEW_SUBJECT,
        ENROL_JOIN_SUBJECT,
    )
    clients = sorted({s for role in CLIENT_ROLES for s in client_imports(_widest(role))} - set(singletons))
    return [*(_service(s) for s in singletons),
            _service(f"{JS_API}.CONSUMER.MSG.NEXT.{COMMANDS_STREAM}.*", streamed_for=PULL_RESPONSE_SECONDS),
            *(_service(s, streamed_for=DIRECT_GET_RESPONSE_SECONDS if ".DIRECT.GET." in s else None)
              for s in clients)]


def _widest(role: Role) -> Principal:
    # A reader's account imports every stream's reads; each reader credential allows its own.
    return Principal(role, streams=ALL_STREAMS if role is Role.READER else ())


def client_account_imports(role: Role, grid_account: str) -> list[dict[str, Any]]:
    return [_import(s, grid_account, local=local_subject(s)) for s in client_imports(_widest(role))]


def _import(subject: str, account: str, *, local: str | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": subject, "subject": subject, "account": account, "type": SERVICE}
    if local is not None and local != subject:
        entry["local_subject"] = local
    return entry


def infer_service(host_id: str) -> str:
    return f"{infer_subject_root(host_id)}.>"


def infer_imports(host_accounts: Iterable[tuple[str, str]]) -> list[dict[str, Any]]:
    """INFER imports each (host id, host account)'s inference service, so gateways reach it."""
    return [_import(infer_service(host_id), account) for host_id, account in host_accounts]


def host_account_imports(principal: Principal, grid_account: str) -> list[dict[str, Any]]:
    return [_import(s, grid_account, local=local_subject(s)) for s in host_imports(principal)]


def host_account_exports(host_id: str) -> list[dict[str, Any]]:
    # A streamed answer runs as long as a generation may (the user JWT's response TTL).
    return [_service(infer_service(host_id), streamed_for=INFER_RESPONSE_TTL_SECONDS)]


def invitee_account_imports(grid_account: str) -> list[dict[str, Any]]:
    return [_import(ENROL_JOIN_SUBJECT, grid_account)]


def infer_grant(user_public_key: str) -> Grant:
    """What a gateway's key may do in INFER: send inference requests, read its own inbox."""
    return Grant(pub_allow=(f"{INFER_ROOT}.>",), pub_deny=(), sub_allow=(f"{inbox_prefix(user_public_key)}.>",),
                 sub_deny=(), allow_responses=False)
