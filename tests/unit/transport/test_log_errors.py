"""grid.transport.log_errors: every nats-py failure of a log operation leaves as the log's own
error, with what was being done in its message; a lost optimistic write is a ConflictError."""

from __future__ import annotations

import nats.errors
import nats.js.errors
import pytest

from grid.events.log import ConflictError, LogError
from grid.transport.log_errors import WRONG_LAST_SEQUENCE, log_errors


@pytest.mark.parametrize(("raised", "kind", "message"), [
    (nats.js.errors.KeyWrongLastSequenceError(description="wrong last sequence: 4"), ConflictError,
     "kv b/k: revision is not 3"),
    (nats.js.errors.BadRequestError(code=400, err_code=WRONG_LAST_SEQUENCE, description="wrong last sequence"),
     ConflictError, "kv b/k: revision is not 3"),
    (nats.js.errors.ServiceUnavailableError(code=503, err_code=10008, description="jetstream unavailable"),
     LogError, "kv b/k failed: jetstream unavailable (10008)"),
    (nats.errors.NoRespondersError(), LogError, "kv b/k: nothing answers (no stream for it, or no controller running to store a host's events)"),
    (nats.errors.TimeoutError(), LogError, "kv b/k timed out"),
    (TimeoutError(), LogError, "kv b/k timed out"),
    (nats.errors.ConnectionClosedError(), LogError, "kv b/k failed: ConnectionClosedError"),
])
def test_each_nats_failure_leaves_as_the_logs_own_error(raised: Exception, kind: type[LogError], message: str) -> None:
    with pytest.raises(LogError) as caught, log_errors("kv b/k", conflict="revision is not 3"):
        raise raised
    assert type(caught.value) is kind
    assert str(caught.value).startswith(message), str(caught.value)
    assert caught.value.__cause__ is raised


def test_a_conflict_without_its_own_words_says_what_the_server_said() -> None:
    with pytest.raises(ConflictError, match="append to grid.ctl.mode: wrong last sequence: 7"), \
            log_errors("append to grid.ctl.mode"):
        raise nats.js.errors.KeyWrongLastSequenceError(description="wrong last sequence: 7")


def test_the_logs_own_errors_and_other_exceptions_pass_through() -> None:
    own = ConflictError("already")
    with pytest.raises(ConflictError) as caught, log_errors("append"):
        raise own
    assert caught.value is own
    with pytest.raises(KeyError), log_errors("append"):
        raise KeyError("not a transport failure")
