from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from grid.events import jetstream
from grid.events.embedded import EmbeddedNats, EmbeddedNatsError, find_nats_server, free_port
from grid.events.jetstream import STREAM_POLICIES, JetStreamLog
from grid.events.log import LogError
from grid.events.subjects import ALL_STREAMS


def test_missing_binary_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EmbeddedNatsError, match="not found|No such file|exited"):
        EmbeddedNats(tmp_path, binary=tmp_path / "no-such-nats-server").start()


def test_taken_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(EmbeddedNatsError, match=f"port {port}.*already in use"):
            EmbeddedNats(tmp_path, port=port).start()


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
