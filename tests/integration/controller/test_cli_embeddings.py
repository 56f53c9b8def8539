"""gridctl model set --embeddings reaches the profile in the log (real controller, real process)."""

from __future__ import annotations

from pathlib import Path

from grid.controller.api import serve_admin
from grid.controller.service import Controller
from grid.transport.jetstream import JetStreamLog

from tests.integration.controller.test_cli_admin import SETTINGS, gridctl


async def test_model_set_embeddings_flag(js_log: JetStreamLog, tmp_path: Path) -> None:
    home = tmp_path / "home"
    ctl = Controller(js_log, home, settings=SETTINGS, controller_id="ctl-emb")
    await ctl.start()
    admin = None
    try:
        admin = await serve_admin(ctl, "127.0.0.1", 0)
        rc, _, err = await gridctl(home, "model", "set", "embedder.gguf", "--memory-mb", "300", "--embeddings")
        assert rc == 0, err
        assert ctl.runner["catalog"].profiles["embedder.gguf"].embeddings is True
        rc, _, err = await gridctl(home, "model", "set", "chatter.gguf", "--memory-mb", "300")
        assert rc == 0, err
        assert ctl.runner["catalog"].profiles["chatter.gguf"].embeddings is False
        rc, out, _ = await gridctl(home, "model", "set", "--help")
        assert "--embeddings" in out and "/v1/embeddings" in out
    finally:
        if admin is not None:
            await admin.stop()
        await ctl.stop()
