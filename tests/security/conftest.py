"""Real nats-server processes in operator mode (accounts, user JWTs), one per test module.

Each module gets its own authority and server so revocations and expiries in one module never
leak into another. Credentials are issued per test through the `creds` factory.
"""

from __future__ import annotations

import asyncio
import contextlib
import base64
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import msgspec
import nats
import nkeys
import pytest

from grid.events import codec
from grid.events.base import Event, new_event_id
from grid.events.subjects import ALL_STREAMS
from grid.identity import jwt
from grid.identity.accounts import AccountJWT
from grid.identity.authority import Authority, push_account_jwts
from grid.identity.connect import connect_log
from grid.controller.ingress import HostIngress
from grid.identity.creds import connect_options, infer_connect_options
from grid.identity.invitations import JoinToken
from grid.identity.permissions import Principal, Role, inbox_prefix
from grid.identity.server import SecuredEmbeddedNats
from grid.transport.jetstream import JetStreamLog
from tests.conftest import reset_streams


SecuredNats = SecuredEmbeddedNats


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return Authority(tmp_path_factory.mktemp("authority") / "identity")


@pytest.fixture(scope="module")
def secured_server(tmp_path_factory: pytest.TempPathFactory, authority: Authority) -> Iterator[SecuredNats]:
    server = SecuredNats(tmp_path_factory.mktemp("secured-nats"), authority)
    server.start()
    try:
        yield server
    finally:
        server.stop()


CredsFactory = Callable[..., Path]


def push_accounts(server: SecuredNats, authority: Authority, updates: list[AccountJWT]) -> None:
    """Hand `server` account JWTs as the system account, as the controller does when it admits a
    host, from a synchronous caller (its own thread and event loop: the caller's loop may be
    running a test)."""

    async def push() -> None:
        options = connect_options(authority.system_creds(now=time.time()), None)
        nc = await nats.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0, **options)
        try:
            await push_account_jwts(nc, updates)
        finally:
            await nc.close()

    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(push())
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


@pytest.fixture
def creds(tmp_path: Path, authority: Authority, request: pytest.FixtureRequest) -> CredsFactory:
    """creds(role, host_id=None, streams=(), ttl=3600.0, now=None) -> a creds file path. A host's
    account is handed to the module's server first (a host lives in an account of its own)."""

    def make(role: Role, host_id: str | None = None, streams: tuple[str, ...] = (),
             ttl: float | None = 3600.0, now: float | None = None) -> Path:
        principal = Principal(role, host_id=host_id, streams=streams)
        name = f"{role.value}-{host_id or 'x'}-{time.monotonic_ns()}.creds"
        path = authority.issue_creds(principal, tmp_path / name, now=time.time() if now is None else now,
                                     ttl_seconds=ttl)
        if host_id is not None and not authority.host_revoked(host_id):
            push_accounts(request.getfixturevalue("secured_server"), authority,
                          authority.admission_updates([host_id], now=time.time()))
        return path

    return make


@pytest.fixture
async def controller_log(secured_server: SecuredNats, creds: CredsFactory) -> AsyncIterator[JetStreamLog]:
    """The controller's log, with every stream freshly created (sequences start at 1), and the
    hosts' ingress running on it as a controller runs it (hosts' appends are stored through it)."""
    log = await connect_log(secured_server.url, name="grid-controller",
                            credentials=creds(Role.CONTROLLER))
    await reset_streams(log)
    try:
        async with host_ingress(log):
            yield log
    finally:
        await log.close()


@contextlib.asynccontextmanager
async def host_ingress(controller: JetStreamLog) -> AsyncIterator[HostIngress]:
    """The hosts' ingress on a controller's log, as the controller runs it: a host's appends are
    stored only while one runs (grid.controller.ingress)."""
    ingress = HostIngress()
    await ingress.start(controller.client)
    try:
        yield ingress
    finally:
        await ingress.stop()


@pytest.fixture
def operator_home(authority: Authority) -> Path:
    """A grid home around this module's authority (it lives in `<home>/identity`), with an
    operator credential where `gridctl up` puts one: what gridctl reads the log as there."""
    from grid.identity.local import CREDS_DIR

    path = authority.directory / CREDS_DIR / "operator.creds"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        authority.issue_creds(Principal(Role.OPERATOR), path, now=time.time(), ttl_seconds=None)
    return authority.directory.parent


async def raw_client(server: SecuredNats, credentials: Path | None, **kwargs: object) -> nats.NATS:
    """A plain nats-py client (what an attacker would use) holding `credentials`."""
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    nc = await nats.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0,
                            error_cb=on_error, **connect_options(credentials, None), **kwargs)
    nc.permission_errors = errors  # type: ignore[attr-defined]
    return nc


async def infer_client(server: SecuredNats, gateway_credentials: Path, **kwargs: object) -> nats.NATS:
    """A plain client as a gateway credential's key in the INFER account: where a gateway's
    inference requests go out (grid.identity.accounts)."""
    options = infer_connect_options(gateway_credentials, None)
    assert options is not None, "not a gateway credential"
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    nc = await nats.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0, error_cb=on_error,
                            **options, **kwargs)
    nc.permission_errors = errors  # type: ignore[attr-defined]
    return nc


async def invitee_client(server: SecuredNats, token: JoinToken) -> nats.NATS:
    """A plain client holding a join token's invitee credential (what a joining machine, or
    someone who copied the token, connects with)."""
    pair = nkeys.from_seed(token.invitee_seed.encode())
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    nc = await nats.connect(
        server.url, allow_reconnect=False, error_cb=on_error,
        user_jwt_cb=lambda: token.invitee_jwt.encode(),
        signature_cb=lambda nonce: base64.b64encode(pair.sign(nonce.encode())),
        inbox_prefix=inbox_prefix(jwt.decode(token.invitee_jwt)["sub"]),
    )
    nc.permission_errors = errors  # type: ignore[attr-defined]
    return nc


GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "events"


def event(tag: str, **changes: object) -> Event:
    """A real catalogue event (from its golden payload) with `changes` and a fresh event id.

    A heartbeat is signed as of now unless `changes` says otherwise: the folds reject one whose
    signed time is far from its receipt time (grid.events.authorship.heartbeat_replay), and the
    golden payload's time is a fixed instant."""
    base = codec.decode((GOLDEN / f"{tag}.json").read_bytes())
    if tag.startswith("host.heartbeat.") and "at" not in changes:
        changes["at"] = time.time()
    return msgspec.structs.replace(base, event_id=new_event_id(), **changes)


async def stream_sequences(log: JetStreamLog) -> dict[str, int]:
    return {name: await log.last_sequence(name) for name in ALL_STREAMS}
