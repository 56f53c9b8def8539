"""gridctl pull smollm2 / model push as real processes against a live controller: the controller
creates the artifact store, pull on its machine stores the bundled model, push is idempotent and
records the digest in a profile (only the artifact fields)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from grid.agent.artifacts import BUNDLED_SHA256, BUNDLED_SIZE_BYTES
from grid.config import GridConfig
from grid.controller.api import serve_admin
from grid.controller.service import Controller, ControllerSettings
from grid.events.subjects import ARTIFACT_STREAM
from grid.transport.artifact_store import stored_artifact
from grid.transport.jetstream import JetStreamLog
from tests.integration.agent.agentkit import seed_cache, wait_for

SETTINGS = ControllerSettings(tick_interval_seconds=0.5, coalesce_seconds=0.02, lease_ttl_seconds=3.0,
                              lease_renew_seconds=0.5, restart_grace_seconds=0.0, background_ticks=False)
MODEL = "SmolLM2.Q4.gguf"


async def folded(ctl: Controller, log: JetStreamLog) -> None:
    """Wait until the controller has folded every event its streams held when this was called
    (what gridctl just appended, here)."""
    ends = {s: await log.last_sequence(s) for s in ctl.runner.streams}

    async def caught_up() -> bool:
        return all(ctl.runner.positions.get(s, 0) >= end for s, end in ends.items())

    await wait_for(caught_up, timeout=10.0)


async def gridctl(home: Path, nats_url: str | None, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "GRID_HOME": str(home), "COLUMNS": "200"}
    env.pop("GRID_ADMIN_URL", None)
    env.pop("GRID_NATS_URL", None)
    if nats_url:
        env["GRID_NATS_URL"] = nats_url
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "grid.cli.main", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


async def test_pull_and_push_store_the_artifact_in_the_grid(js_log: JetStreamLog, nats_server, tmp_path: Path,
                                                            bundled_gguf: Path) -> None:
    js = js_log.client.jetstream()
    try:
        await js.delete_object_store("grid_artifacts")
    except Exception:  # not there yet: nothing to delete
        pass
    home = tmp_path / "home"
    ctl = Controller(js_log, home, settings=SETTINGS, controller_id="ctl-push")
    await ctl.start()
    admin = None
    try:
        admin = await serve_admin(ctl, "127.0.0.1", 0)
        seed_cache(GridConfig(home=home, nats_url=None), bundled_gguf)
        url = nats_server.url

        # On the controller's machine, pull also stores the (already cached) model in the grid.
        rc, out, err = await gridctl(home, url, "pull", "smollm2")
        assert rc == 0, err
        assert "stored in the grid's artifact store" in out, out + err
        stored = await stored_artifact(js, BUNDLED_SHA256)
        assert stored is not None and stored.size == BUNDLED_SIZE_BYTES and stored.digest_matches
        last_seq = (await js.stream_info(ARTIFACT_STREAM)).state.last_seq

        rc, out, err = await gridctl(home, None, "model", "set", MODEL, "--memory-mb", "600", "--priority", "7")
        assert rc == 0, err
        rc, out, err = await gridctl(home, url, "model", "push", str(bundled_gguf), "--model", MODEL, "--json")
        assert rc == 0, err
        result = json.loads(out)
        assert result == {"sha256": BUNDLED_SHA256, "size_bytes": BUNDLED_SIZE_BYTES, "result": "already_stored",
                          "model": MODEL}
        assert (await js.stream_info(ARTIFACT_STREAM)).state.last_seq == last_seq  # nothing stored twice
        await folded(ctl, js_log)
        profile = ctl.runner["catalog"].profiles[MODEL]
        assert (profile.artifact_sha256, profile.artifact_size_mb, profile.priority) == (BUNDLED_SHA256, 94, 7)

        # A new file is stored, with its size printed; a profile that does not exist is an error.
        other = tmp_path / "other.gguf"
        other.write_bytes(os.urandom(700_000))
        rc, out, err = await gridctl(home, url, "model", "push", str(other))
        assert rc == 0 and "stored in the grid" in out and "700000 bytes" in out, out + err
        rc, out, err = await gridctl(home, url, "model", "push", str(other), "--model", "nope.gguf")
        assert rc != 0 and "no profile 'nope.gguf'" in err, out + err
        rc, out, err = await gridctl(home, url, "model", "push", str(tmp_path / "missing.gguf"))
        assert rc == 2 and "not a readable file" in err
    finally:
        if admin is not None:
            await admin.stop()
        await ctl.stop()


async def test_pull_without_a_grid_keeps_the_local_cache(tmp_path: Path, bundled_gguf: Path) -> None:
    home = tmp_path / "home"
    seed_cache(GridConfig(home=home, nats_url=None), bundled_gguf)
    rc, out, err = await gridctl(home, None, "pull", "smollm2")
    assert rc == 0 and "already cached and verified" in out and "artifact store" not in out + err
