"""The hosts stream's per-subject and message-size limits, on a real server: created with them,
and an existing deployment's stream updated to them in place by ensure_streams (messages kept)."""

from __future__ import annotations

from grid.events.subjects import CONTROL_STREAM, HOSTS_STREAM, host_subject
from grid.transport.jetstream import (
    CONTROL_EVENT_MAX_BYTES,
    HOST_EVENT_MAX_BYTES,
    HOST_SUBJECT_HISTORY,
    GIB,
    JetStreamLog,
    host_footprint_bytes,
    protected_hosts,
)
from grid.transport.embedded import STREAM_INGEST_QUEUE_MSGS, EmbeddedNats
from tests.heartbeats import heartbeat


async def test_an_existing_hosts_stream_gets_its_limits_in_place(js_log: JetStreamLog) -> None:
    js = js_log.client.jetstream()
    # A deployment from before the limits: no per-subject history, no message size bound.
    info = await js.stream_info(HOSTS_STREAM)
    info.config.max_msgs_per_subject = -1
    info.config.max_msg_size = -1
    await js.update_stream(info.config)
    first = await js_log.append(heartbeat("h1"))
    assert (await js.stream_info(HOSTS_STREAM)).config.max_msgs_per_subject == -1

    await js_log.ensure_streams()
    info = await js.stream_info(HOSTS_STREAM)
    assert info.config.max_msgs_per_subject == HOST_SUBJECT_HISTORY
    assert info.config.max_msg_size == HOST_EVENT_MAX_BYTES
    assert (await js.stream_info(CONTROL_STREAM)).config.max_msg_size == CONTROL_EVENT_MAX_BYTES
    kept = await js_log.last_message(host_subject("h1", "heartbeat"))
    assert kept is not None and kept.seq == first.seq  # updated, not made anew

    # The per-subject bound holds from now on: one subject keeps only its latest history.
    for i in range(HOST_SUBJECT_HISTORY + 10):
        await js_log.append(heartbeat("h2", at=1000.0 + i))
    counts = (await js.stream_info(HOSTS_STREAM, subjects_filter=host_subject("h2", "heartbeat"))).state.subjects
    assert counts == {host_subject("h2", "heartbeat"): HOST_SUBJECT_HISTORY}
    assert (await js_log.last_message(host_subject("h1", "heartbeat"))).seq == first.seq  # type: ignore[union-attr]


def test_the_default_hosts_stream_holds_one_flooders_footprint_beside_a_large_fleet() -> None:
    # 5 subjects x 512 messages x 64 KiB: 160 MiB at most for one host; beside it the default
    # 2 GiB holds some 1,500 hosts' histories.
    assert host_footprint_bytes() == 5 * HOST_SUBJECT_HISTORY * HOST_EVENT_MAX_BYTES == 160 << 20
    assert protected_hosts(2 * GIB) == 1510
    assert protected_hosts(host_footprint_bytes()) == 0


def test_the_embedded_server_queues_little_ahead_of_a_streams_store(nats_server: EmbeddedNats) -> None:
    # A flood past the store's rate is refused at the door instead of queued for tens of seconds in
    # front of every other publisher to the stream (grid.transport.embedded).
    config = (nats_server.store_dir / "nats-server.conf").read_text()
    assert f"max_buffered_msgs: {STREAM_INGEST_QUEUE_MSGS}\n" in config
    assert STREAM_INGEST_QUEUE_MSGS <= 10_000
