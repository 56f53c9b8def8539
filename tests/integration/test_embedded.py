from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from grid.events.log import LogError
from grid.events.subjects import ALL_STREAMS
from grid.transport import embedded, jetstream
from grid.transport.embedded import EmbeddedNats, EmbeddedNatsError, find_nats_server, free_port
from grid.transport.jetstream import STREAM_POLICIES, JetStreamLog


def test_missing_binary_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EmbeddedNatsError, match="not found|No such file|exited"):
        EmbeddedNats(tmp_path, binary=tmp_path / "no-such-nats-server").start()


def test_taken_port_is_a_clear_error(tmp_path: Path, taken_port: int) -> None:
    with pytest.raises(EmbeddedNatsError, match=f"port {taken_port}.*already in use"):
        EmbeddedNats(tmp_path, port=taken_port).start()


def test_free_port_never_repeats_a_recent_pick() -> None:
    # The kernel's bind(0) repeats itself about once in 400 picks (35 times in 1000 here), so
    # 1000 picks without the memory of recent ones would all but surely hold a repeat.
    picks = [free_port() for _ in range(1000)]
    assert len(set(picks)) == len(picks)


def test_a_picked_port_taken_before_the_server_binds_it_is_picked_again(
        tmp_path: Path, taken_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # The first pick is a port another process bound in between (as a race would leave it).
    picks = iter([taken_port])
    monkeypatch.setattr(embedded, "free_port", lambda host="127.0.0.1": next(picks, None) or free_port(host))
    server = EmbeddedNats(tmp_path).start()
    try:
        assert server.alive and taken_port not in (server.port, server.monitor_port)
        log = server.log_path.read_text()
        assert f"{taken_port}" in log and "address already in use" in log  # the first launch met it
        health = httpx.get(f"http://127.0.0.1:{server.monitor_port}/healthz?js-enabled-only=true", timeout=5)
        assert health.status_code == 200
    finally:
        server.stop()


async def test_server_runs_jetstream_with_fsync_always_and_bounded_streams(nats_server: EmbeddedNats) -> None:
    config = (nats_server.store_dir / "nats-server.conf").read_text()
    assert "sync_interval: always" in config
    assert str(nats_server.store_dir) in config
    log = await JetStreamLog.connect(nats_server.url)
    try:
        await log.ensure_streams()  # idempotent
        js = log.client.jetstream()
        for name in ALL_STREAMS:
            info = await js.stream_info(name)
            policy = STREAM_POLICIES[name]
            assert info.config.max_bytes == policy.max_bytes > 0
            assert str(getattr(info.config.storage, "value", info.config.storage)) == "file"
            if policy.max_age_seconds:
                assert info.config.max_age == policy.max_age_seconds
            else:
                assert info.config.max_msgs_per_subject > 0
    finally:
        await log.close()


def test_stop_is_clean_and_idempotent(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path).start()
    proc = server.process
    assert proc is not None and proc.poll() is None
    server.stop()
    assert proc.poll() is not None
    server.stop()
    assert not (tmp_path / "nats-server.pid").exists()


async def test_a_server_without_jetstream_is_a_clear_error_after_a_bounded_wait(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real nats-server started without JetStream: stream setup waits (a new cluster enables an
    account's JetStream a moment after it reports healthy), then says what to fix."""
    monkeypatch.setattr(jetstream, "JETSTREAM_READY_SECONDS", 1.0)
    port = free_port()
    proc = subprocess.Popen([str(find_nats_server()), "-a", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "nats-server did not listen"
            time.sleep(0.05)
        started = time.monotonic()
        with pytest.raises(LogError, match="JetStream does not answer.*run nats-server with JetStream enabled"):
            await JetStreamLog.connect(f"nats://127.0.0.1:{port}")
        assert 1.0 <= time.monotonic() - started < 8.0
    finally:
        proc.terminate()
        proc.wait(10)
