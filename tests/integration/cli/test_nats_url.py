"""One NATS URL resolution for every gridctl command: --nats, GRID_NATS_URL, the running grid's record.

grid.config.resolve_nats_url is the only place that decides; commands turn its typed error into
one clear message. The commands here talk to the session's real nats-server.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from grid.config import GridConfig, NatsUrlNotFound, resolve_nats_url
from grid.events.control import ModelProfile, ProfileSet

UNREACHABLE = "nats://127.0.0.1:9"  # the discard port: nothing listens there


def gridctl(home: Path, *args: str, nats_env: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GRID_HOME": str(home), "COLUMNS": "300"}
    env.pop("GRID_NATS_URL", None)
    if nats_env is not None:
        env["GRID_NATS_URL"] = nats_env
    return subprocess.run([sys.executable, "-m", "grid.cli.main", *args], env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=60)


def test_explicit_then_environment_then_the_recorded_url(tmp_path: Path) -> None:
    recorded = GridConfig(home=tmp_path, nats_url=None)
    with pytest.raises(NatsUrlNotFound) as missing:
        resolve_nats_url(None, recorded)
    assert missing.value.recorded == tmp_path / "nats.url"

    (tmp_path / "nats.url").write_text("nats://recorded:4222\n")
    assert resolve_nats_url(None, recorded) == "nats://recorded:4222"
    from_env = GridConfig.from_environ({"GRID_HOME": str(tmp_path), "GRID_NATS_URL": "nats://env:4222"})
    assert resolve_nats_url(None, from_env) == "nats://env:4222"
    assert resolve_nats_url("nats://flag:4222", from_env) == "nats://flag:4222"

    (tmp_path / "nats.url").write_text("\n")  # a record cut short counts as none
    with pytest.raises(NatsUrlNotFound):
        resolve_nats_url(None, recorded)


@pytest.mark.parametrize(
    "command",
    [["events", "tail"], ["serve", "controller"], ["serve", "gateway"], ["node", "start"]],
    ids=lambda c: " ".join(c),
)
def test_every_component_without_a_url_says_how_to_get_one(tmp_path: Path, command: list[str]) -> None:
    result = gridctl(tmp_path, *command)
    assert result.returncode == 1, result.stdout + result.stderr
    flat = " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr
    assert "gridctl up" in flat and "--nats" in flat and str(tmp_path / "nats.url") in flat, result.stderr


async def test_commands_find_the_running_grid_and_the_environment_wins(js_log, nats_server, tmp_path: Path) -> None:
    await js_log.append(ProfileSet(event_id="p-url", at=0, profile=ModelProfile(model_id="url.gguf", memory_mb=64)))
    (tmp_path / "nats.url").write_text(nats_server.url + "\n")
    found = gridctl(tmp_path, "events", "tail", "--json")
    assert found.returncode == 0, found.stderr
    assert "url.gguf" in found.stdout

    (tmp_path / "nats.url").write_text(UNREACHABLE + "\n")
    overridden = gridctl(tmp_path, "events", "tail", "--json", nats_env=nats_server.url)
    assert overridden.returncode == 0, overridden.stderr
    assert "url.gguf" in overridden.stdout
