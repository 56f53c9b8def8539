"""Whom a Grid service answers: the requester, under its own inbox, and nobody else.

The server checks no permission on a request's reply subject, and whatever it carries to a
subject a stream captures is stored. A service that answered any reply subject would therefore
publish, with its own rights, wherever a requester pointed it (`grid.ctl.mode`, `grid.plan`,
`grid.cmd.<host>`). So every service Grid runs over core NATS request/reply (the agent's
inference responder, the controller's enrolment service) answers only on a reply subject under
the requester's own inbox prefix (`inbox_prefix(key)`, the one subtree that credential may
subscribe to), and learns that key from the request itself: the requester signs subject and
payload as its identity (grid.identity.signing, the same headers as a signed event), and the
service verifies the signature against the grid's account key and the permission table (the
signer must be allowed to publish that request at all).

A request that crossed from another account (a host's renewal into GRID, a gateway's inference
request into a host's account: grid.identity.accounts) carries a reply subject the server made
up, under `_R_.`, which it maps back to the requester's own reply subject in the requester's own
account. That is as safe as the requester's inbox: no stream captures `_R_.`, and whatever the
requester named lands in its own account. So such a reply is answered too.

On a grid without identities (no credentials: a development server) there is no key to check;
the reply must still lie under `_INBOX.`, which no stream captures.

A refused request is answered with nothing (an answer is exactly what must not be sent); the
service logs a warning with the reason and counts it.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping

import msgspec

from grid.events.authorship import Signed
from grid.identity.permissions import INBOX_ROOT, Role, inbox_prefix

# Where the server puts the reply subject of a request that crossed a service import.
IMPORTED_REPLY_ROOT = "_R_"
from grid.identity.signing import Verifier

# Why a service did not answer a request (besides the signature reasons of grid.identity.signing).
REFUSED_NO_REPLY = "no_reply_subject"
REFUSED_REPLY_NOT_INBOX = "reply_not_requester_inbox"
REFUSED_ROLE = "role_not_served"


class RequestCheck(msgspec.Struct, frozen=True, kw_only=True):
    """The verdict on one request: answer it (`ok`), or the reason not to."""

    reason: str = ""
    signed: Signed = msgspec.field(default_factory=Signed)

    @property
    def ok(self) -> bool:
        return not self.reason


def check_request(verifier: Verifier | None, subject: str, data: bytes, headers: Mapping[str, str] | None,
                  reply: str | None, *, roles: Collection[Role] | None = None,
                  now: float | None = None) -> RequestCheck:
    """May a service answer this request on `reply`?

    With a verifier: the request must be signed by a credential of this grid allowed to publish
    on `subject` (and, if `roles` is given, of one of those roles), and `reply` must lie under
    that credential's inbox (or be one the server made up for a request from another account).
    Without one (no identities on this grid): `reply` must lie under
    `_INBOX.`.
    """
    if not reply:
        return RequestCheck(reason=REFUSED_NO_REPLY)
    if verifier is None:
        return RequestCheck() if reply.startswith(INBOX_ROOT + ".") else RequestCheck(reason=REFUSED_REPLY_NOT_INBOX)
    signed = verifier.verify(subject, data, headers, at=time.time() if now is None else now)
    if not signed.ok:
        return RequestCheck(reason=signed.reason, signed=signed)
    if roles is not None and signed.role not in {r.value for r in roles}:
        return RequestCheck(reason=REFUSED_ROLE, signed=signed)
    if not reply.startswith((inbox_prefix(signed.signer) + ".", IMPORTED_REPLY_ROOT + ".")):
        return RequestCheck(reason=REFUSED_REPLY_NOT_INBOX, signed=signed)
    return RequestCheck(signed=signed)
