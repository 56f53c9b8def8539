"""`gridctl model set` on an existing profile changes only the fields given (`--replace` replaces).

Before, `model set MODEL --memory-mb 600` silently reset min_replicas, artifact_sha256 and
workload_scores to their defaults, and the next chat got 503.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from grid.controller.api import serve_admin
from grid.controller.service import Controller
from grid.transport.jetstream import JetStreamLog

from tests.integration.controller.test_cli_admin import SETTINGS, gridctl

SHA = "ab" * 32


async def test_model_set_patches_an_existing_profile_and_prints_it(js_log: JetStreamLog, tmp_path: Path) -> None:
    home = tmp_path / "home"
    ctl = Controller(js_log, home, settings=SETTINGS, controller_id="ctl-patch")
    await ctl.start()
    admin = await serve_admin(ctl, "127.0.0.1", 0)
    try:
        rc, out, err = await gridctl(home, "model", "set", "m.gguf", "--memory-mb", "600", "--min-replicas", "1",
                                     "--artifact-sha256", SHA, "--workload-score", "coding=0.8")
        assert rc == 0, err
        rc, out, err = await gridctl(home, "model", "set", "m.gguf", "--memory-mb", "700")
        assert rc == 0, err
        prof = ctl.runner["catalog"].profiles["m.gguf"]
        assert prof.memory_mb == 700 and prof.min_replicas == 1 and prof.artifact_sha256 == SHA
        assert prof.workload_scores == {"coding": 0.8}
        # The resulting profile is printed, in MiB.
        assert "min_replicas" in out and "700 MiB" in out and SHA in out, out
        rc, out, err = await gridctl(home, "model", "set", "m.gguf", "--priority", "3", "--json")
        assert rc == 0 and json.loads(out)["profile"]["priority"] == 3 and json.loads(out)["profile"]["memory_mb"] == 700
        # A change that makes the merged profile invalid is refused, nothing appended.
        rc, out, err = await gridctl(home, "model", "set", "m.gguf", "--max-replicas", "0")
        assert rc != 0 and "max_replicas" in err
        assert ctl.runner["catalog"].profiles["m.gguf"].max_replicas == 1
        # --replace: the old behaviour, every option not given takes its default.
        rc, out, err = await gridctl(home, "model", "set", "m.gguf", "--memory-mb", "800", "--replace")
        assert rc == 0, err
        prof = ctl.runner["catalog"].profiles["m.gguf"]
        assert prof.memory_mb == 800 and prof.min_replicas == 0 and prof.artifact_sha256 is None
        # A new profile needs its memory budget.
        rc, out, err = await gridctl(home, "model", "set", "new.gguf", "--min-replicas", "1")
        assert rc != 0 and "--memory-mb is required" in err and "new.gguf" not in ctl.runner["catalog"].profiles
        async with httpx.AsyncClient(base_url=admin.url) as client:
            # PATCH needs the operator token, refuses unknown fields, and 404s an unknown model.
            assert (await client.patch("/allocator/models/m.gguf", json={"priority": 9})).status_code == 401
            token = {"X-Grid-Allocator-Token": ctl.token or ""}
            bad = await client.patch("/allocator/models/m.gguf", json={"prioriti": 9}, headers=token)
            assert bad.status_code == 422 and bad.json()["field"] == "prioriti"
            assert (await client.patch("/allocator/models/zzz", json={"priority": 9}, headers=token)).status_code == 404
        assert ctl.runner["catalog"].profiles["m.gguf"].priority == 0
    finally:
        await admin.stop()
        await ctl.stop()


def test_every_model_set_option_has_help_and_states_its_default(tmp_path: Path) -> None:
    import typer.main

    from grid.cli.main import app

    group = typer.main.get_command(app)
    command = group.commands["model"].commands["set"]  # type: ignore[attr-defined]
    for param in command.params:
        if param.param_type_name != "option" or param.name == "help":
            continue
        text = param.help or ""
        assert text, f"--{param.name} has no help"
        if param.name not in ("json_out", "admin", "token_file", "replace"):
            assert "new profile" in text, f"--{param.name} does not state its default: {text}"
        assert " MB" not in text, f"--{param.name} says MB, not MiB: {text}"
