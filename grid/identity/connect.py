"""Connect to the log as an identity: a `.creds` file and the CA that vouches for the server.

The log (grid.transport.jetstream) knows nothing of identities: it takes nats-py options. This is
where an identity's credential becomes those options, so grid.events never imports grid.identity.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grid.events.subjects import COMMANDS_STREAM, COMMANDS_VIEW_STREAM
from grid.identity.creds import connect_options, creds_claims, infer_connect_options
from grid.identity.permissions import CLIENT_ROLES, IMPORTED_JS_PREFIX, Role
from grid.identity.signing import Identity
from grid.transport.jetstream import JetStreamLog


async def connect_log(url: str, *, credentials: Path | None = None, tls_ca: Path | None = None,
                      **kwargs: Any) -> JetStreamLog:
    """`JetStreamLog.connect` as the identity of `credentials`, verifying the server with `tls_ca`.

    Only the controller manages streams: every other identity passes `ensure_streams=False`,
    since the server refuses it stream creation. With a credential the log signs every append
    as that identity and its readers verify against the grid that issued it. Every identity but
    the controller replays and tails commands through the controller's mirror of GRID_CMDS
    (grid.identity.permissions says why). Every identity but the controller, in an account of its
    own, reaches the JetStream API under the prefix its account imports it as
    (grid.identity.accounts).
    """
    identity = Identity.from_creds(Path(credentials)) if credentials is not None else None
    prefix = api_prefix(identity, credentials)
    event_log = await JetStreamLog.connect(url, nats_options=connect_options(credentials, tls_ca),
                                           api_prefix=prefix, **kwargs)
    event_log.authorship = identity
    # Outside GRID a consumer cannot be had (its deliver subject would be in GRID): gateways,
    # operators and readers read by direct gets (grid.transport.direct_reads).
    event_log.direct_reads = prefix is not None and identity is not None and identity.role in CLIENT_ROLES
    if identity is not None and identity.role is not Role.CONTROLLER:
        event_log.views = {COMMANDS_STREAM: COMMANDS_VIEW_STREAM}
    if credentials is not None and identity is not None and identity.role is Role.GATEWAY:
        options = infer_connect_options(Path(credentials), tls_ca)
        if options is not None:
            name = kwargs.get("name", "grid-gateway")
            event_log.infer_connector = lambda: JetStreamLog.connect(  # type: ignore[attr-defined]
                url, name=f"{name}-infer", nats_options=options, ensure_streams=False)
    return event_log


def api_prefix(identity: Identity | None, credentials: Path | None) -> str | None:
    """The JetStream API prefix of `credentials`' account: an account of its own (a host's, or a
    gateway's, operator's or reader's) imports it under IMPORTED_JS_PREFIX; the controller (and a
    credential issued by the grid's account itself, before the roles had accounts) is in the
    account that has JetStream."""
    if identity is None or credentials is None:
        return None
    in_own_account = creds_claims(Path(credentials)).get("iss") != identity.signer.account
    return IMPORTED_JS_PREFIX if identity.role is not Role.CONTROLLER and in_own_account else None
