"""The gateway refuses to listen beyond loopback without client keys unless told --insecure."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import httpx
import pytest

from grid.config import GridConfig
from grid.gateway.app import GatewayExposureError, create_gateway_app, start_gateway
from grid.gateway.settings import exposure_error, is_loopback
from grid.transport.jetstream import JetStreamLog


def test_loopback_and_exposure_rules() -> None:
    for host in ("127.0.0.1", "127.0.0.9", "::1", "[::1]", "localhost"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.1.2.3", "192.168.0.1", "gateway.example"):
        assert not is_loopback(host), host
        assert exposure_error(host, keys_required=False, insecure=False)
        assert exposure_error(host, keys_required=True, insecure=False) is None
        assert exposure_error(host, keys_required=False, insecure=True) is None


async def test_start_gateway_beyond_loopback(js_log: JetStreamLog, tmp_path: Path) -> None:
    cfg = GridConfig(home=tmp_path, nats_url=None)
    with pytest.raises(GatewayExposureError, match="GRID_GATEWAY_API_KEYS"):
        await start_gateway(create_gateway_app(js_log, cfg, api_keys=[]), "0.0.0.0", 0, write_url_file=False)
    assert not (tmp_path / "gateway.url").exists()

    running = await start_gateway(create_gateway_app(js_log, cfg, api_keys=["k-1"]), "0.0.0.0", 0,
                                  write_url_file=False)
    try:
        async with httpx.AsyncClient(base_url=running.url, trust_env=False) as http:
            assert (await http.get("/v1/models")).status_code == 401
            assert (await http.get("/v1/models", headers={"Authorization": "Bearer k-1"})).status_code == 200
    finally:
        await running.stop()

    running = await start_gateway(create_gateway_app(js_log, cfg, api_keys=[]), "0.0.0.0", 0,
                                  write_url_file=False, insecure=True)
    await running.stop()


@pytest.mark.parametrize("argv", [["serve", "gateway"], ["up", "--no-wait"]])
async def test_cli_refuses_an_open_gateway_beyond_loopback(argv: list[str], tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRID_")}
    env.update(GRID_HOME=str(tmp_path), GRID_NATS_URL="nats://127.0.0.1:1")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "grid.cli.main", *argv, "--host", "0.0.0.0", "--port", "0", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1, out + err
    text = " ".join(err.decode().split())
    assert "refusing to serve the gateway on 0.0.0.0 without client keys" in text and "--insecure" in text
    assert "Traceback" not in text
    assert not (tmp_path / "gateway.url").exists() and not (tmp_path / "nats.url").exists()
