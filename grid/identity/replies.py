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
    that credential's inbox. Without one (no identities on this grid): `reply` must lie under
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
    if not reply.startswith(inbox_prefix(signed.signer) + "."):
        return RequestCheck(reason=REFUSED_REPLY_NOT_INBOX, signed=signed)
    return RequestCheck(signed=signed)
