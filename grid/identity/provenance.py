"""What the server's authorization vouches for: the subject of a stored event, not its payload.

NATS checks who may publish on which subject; it never reads the payload. A host may publish on
`grid.host.<its id>.heartbeat` a heartbeat whose body names another host, and the server stores
it. Folding that body as the other host's heartbeat would undo the permission table, so a
consumer accepts an event only when the subject it was stored under is the one `subject_for`
derives from the event itself (the subject is the authenticated part).
"""

from __future__ import annotations

from grid.events.base import Event
from grid.events.log import StoredMessage
from grid.events.subjects import SubjectError, subject_for

# The reason a consumer records when it skips such an event.
SUBJECT_MISMATCH = "subject_mismatch"


def vouched_for(message: StoredMessage, event: Event) -> bool:
    """True when `event` (decoded from `message`) is stored under the subject it must have."""
    try:
        return subject_for(event) == message.subject
    except SubjectError:
        return False
