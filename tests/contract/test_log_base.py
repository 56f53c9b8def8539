"""What EventLogBase does for both logs: signing appends, the headers' order, the replay window.

Both logs share these through grid.events.log.EventLogBase; the tests run against every log of
the contract suite, so neither can drift from the other.
"""

from __future__ import annotations

from typing import Any

from grid.events.host import HostHeartbeat, HostResources
from grid.events.subjects import HOSTS_STREAM, subject_for
from grid.transport.jetstream import JetStreamLog

SIGNER = "Test-Signer"
SIG = "Test-Sig"


class FixedAuthorship:
    """Signs with headers naming the subject and the payload's length (the log only calls sign)."""

    def __init__(self) -> None:
        self.signed: list[tuple[str, bytes]] = []

    def sign(self, subject: str, data: bytes) -> dict[str, str]:
        self.signed.append((subject, bytes(data)))
        return {SIGNER: "tester", SIG: f"{subject}:{len(data)}"}


def heartbeat(i: int) -> HostHeartbeat:
    return HostHeartbeat(event_id=f"hb-{i}", at=float(i), host_id="host-a", resources=HostResources(capacity_mb=1024))


async def test_append_is_signed_after_the_callers_headers(event_log: Any) -> None:
    event_log.authorship = FixedAuthorship()
    subject = subject_for(heartbeat(0))
    headers = {"X-Caller": "kept", SIGNER: "forged"}
    await event_log.append_raw(subject, b"payload", msg_id="m-1", headers=headers)
    assert headers == {"X-Caller": "kept", SIGNER: "forged"}  # the caller's dict is left as it was
    assert event_log.authorship.signed == [(subject, b"payload")]
    [stored] = [m async for m in event_log.replay(HOSTS_STREAM)]
    assert stored.headers is not None
    assert stored.headers["X-Caller"] == "kept"
    assert stored.headers[SIGNER] == "tester" and stored.headers[SIG] == f"{subject}:7"


async def test_unsigned_append_without_headers_stores_none_beyond_the_stores_own(event_log: Any) -> None:
    await event_log.append(heartbeat(1))
    [stored] = [m async for m in event_log.replay(HOSTS_STREAM)]
    assert stored.msg_id == "hb-1"
    assert not {k: v for k, v in (stored.headers or {}).items() if not k.startswith("Nats-")}


async def test_replay_window_is_the_same_on_every_log(event_log: Any) -> None:
    for i in range(1, 6):
        await event_log.append(heartbeat(i))
    assert [m.seq async for m in event_log.replay(HOSTS_STREAM, start_seq=2, end_seq=4)] == [2, 3, 4]
    assert [m.seq async for m in event_log.replay(HOSTS_STREAM, end_seq=99)] == [1, 2, 3, 4, 5]
    assert [m.seq async for m in event_log.replay(HOSTS_STREAM, start_seq=6)] == []
    assert [m.seq async for m in event_log.replay(HOSTS_STREAM, start_seq=4, end_seq=3)] == []
    # A start time does not lift the start sequence's bound on the window (JetStream's rule).
    assert [m.seq async for m in event_log.replay(HOSTS_STREAM, start_time=0.0, start_seq=4, end_seq=3)] == []
    assert [m.seq async for m in event_log.replay(HOSTS_STREAM, start_time=0.0, end_seq=2)] == [1, 2]


async def test_subscribe_without_a_start_sees_only_new_messages(event_log: Any) -> None:
    await event_log.append(heartbeat(1))
    sub = await event_log.subscribe(HOSTS_STREAM)
    try:
        assert await sub.next(timeout=0.2) is None
        await event_log.append(heartbeat(2))
        msg = await sub.next(timeout=5)
        assert msg is not None and msg.seq == 2
    finally:
        await sub.close()


async def test_jetstream_request_headers_keep_their_order(event_log: Any) -> None:
    """The bytes JetStreamLog sends: the caller's headers, then Nats-Msg-Id and the expected
    sequence, then the signature, in that order (as before EventLogBase)."""
    if not isinstance(event_log, JetStreamLog):
        return
    event_log.authorship = FixedAuthorship()
    sent: list[dict[str, str] | None] = []
    request = event_log.client.request

    async def recording(subject: str, data: bytes, **kwargs: Any) -> Any:
        sent.append(kwargs.get("headers"))
        return await request(subject, data, **kwargs)

    event_log.client.request = recording
    try:
        subject = subject_for(heartbeat(0))
        await event_log.append_raw(subject, b"x", msg_id="m-1", expected_last_subject_seq=0, headers={"X-Caller": "a"})
        await event_log.append_raw(subject, b"y")
        event_log.authorship = None
        await event_log.append_raw(subject, b"z")
    finally:
        del event_log.client.request
    assert [list(h) if h is not None else None for h in sent] == [
        ["X-Caller", "Nats-Msg-Id", "Nats-Expected-Last-Subject-Sequence", SIGNER, SIG],
        [SIGNER, SIG],
        None,
    ]
    assert sent[0] is not None and sent[0]["Nats-Expected-Last-Subject-Sequence"] == "0"
