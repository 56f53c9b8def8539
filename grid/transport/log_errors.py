"""One translation of nats-py's exceptions into the event log's own errors.

Readers and writers of the log (grid.events.log.EventLog) handle `LogError` and `ConflictError`
only. What each nats-py failure means to them is said here, once, instead of each call site of
the JetStream log catching its own selection and letting the rest escape as nats-py types.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import nats.errors
import nats.js.errors

from grid.events.log import ConflictError, LogError

# JetStream's error code for a failed expected-last-sequence check (an optimistic write lost).
WRONG_LAST_SEQUENCE = 10071


@contextlib.contextmanager
def log_errors(doing: str, *, conflict: str = "") -> Iterator[None]:
    """Run one log operation, described by `doing` ("append to grid.ctl.mode"); a nats-py failure
    leaves it as ConflictError (an expected sequence or revision did not hold, said by `conflict`
    when given) or as LogError."""
    try:
        yield
    except nats.js.errors.KeyWrongLastSequenceError as exc:
        raise ConflictError(f"{doing}: {conflict or exc.description}") from exc
    except nats.js.errors.APIError as exc:
        if exc.err_code == WRONG_LAST_SEQUENCE:
            raise ConflictError(f"{doing}: {conflict or exc.description}") from exc
        raise LogError(f"{doing} failed: {exc.description} ({exc.err_code})") from exc
    except nats.errors.NoRespondersError as exc:
        raise LogError(f"{doing}: nothing answers (no stream for it, or no controller running to store a host's events)") from exc
    except (nats.errors.TimeoutError, asyncio.TimeoutError) as exc:
        raise LogError(f"{doing} timed out") from exc
    except nats.errors.Error as exc:
        raise LogError(f"{doing} failed: {type(exc).__name__}: {exc}") from exc
