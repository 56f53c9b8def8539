"""Grid's streams state their consumer limit, so a server's default (nats-server 2.15's
default_max_consumers, 1,000) never caps the command consumers of a large fleet."""

from __future__ import annotations

from pathlib import Path

from nats.js import api

from grid.events.subjects import ALL_STREAMS, COMMANDS_STREAM, STREAM_SUBJECTS, command_subject
from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import DUPLICATE_WINDOW_SECONDS, MAX_CONSUMERS_PER_STREAM, JetStreamLog

SERVER_DEFAULT = 3


class LowDefaultNats(EmbeddedNats):
    """A real server whose default consumer limit per stream is tiny, to reach it quickly."""

    def _write_config(self) -> Path:
        path = super()._write_config()
        text = path.read_text()
        assert "jetstream {\n" in text
        path.write_text(text.replace("jetstream {\n", f"jetstream {{\n  limits {{ default_max_consumers: {SERVER_DEFAULT} }}\n", 1))
        return path


async def test_more_command_consumers_than_the_server_default_and_an_older_stream_is_raised(tmp_path: Path) -> None:
    server = LowDefaultNats(tmp_path / "nats")
    server.start()
    try:
        log = await JetStreamLog.connect(server.url, ensure_streams=False)
        try:
            js = log.client.jetstream()
            # GRID_CMDS as an earlier version made it: no consumer limit of its own.
            await js.add_stream(api.StreamConfig(name=COMMANDS_STREAM, subjects=list(STREAM_SUBJECTS[COMMANDS_STREAM]),
                                                 duplicate_window=DUPLICATE_WINDOW_SECONDS))
            for i in range(SERVER_DEFAULT):
                await (await log.subscribe(COMMANDS_STREAM, durable=f"old-{i}",
                                           subject_filter=command_subject(f"old-{i}"))).close()
            await log.ensure_streams()
            for name in ALL_STREAMS:
                assert (await js.stream_info(name)).config.max_consumers == MAX_CONSUMERS_PER_STREAM, name
            hosts = [f"host-{i}" for i in range(2 * SERVER_DEFAULT)]
            for host in hosts:
                sub = await log.subscribe(COMMANDS_STREAM, durable=f"agent-{host}", subject_filter=command_subject(host))
                await sub.close()
            names = {c.name for c in await js.consumers_info(COMMANDS_STREAM)}
            assert {f"agent-{h}" for h in hosts} <= names and len(names) >= 3 * SERVER_DEFAULT
        finally:
            await log.close()
    finally:
        server.stop()
