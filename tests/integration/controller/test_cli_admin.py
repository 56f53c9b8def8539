"""gridctl status / model set / model rm / mode / tick as real processes against a live controller."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from grid.controller.api import serve_admin
from grid.controller.service import Controller, ControllerSettings
from grid.transport.jetstream import JetStreamLog

from tests.integration.controller.simhost import SimHost

SETTINGS = ControllerSettings(tick_interval_seconds=0.5, coalesce_seconds=0.02, lease_ttl_seconds=3.0,
                              lease_renew_seconds=0.5, restart_grace_seconds=0.0)


async def gridctl(home: Path, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "GRID_HOME": str(home), "COLUMNS": "200"}
    env.pop("GRID_ADMIN_URL", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "grid.cli.main", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


async def test_gridctl_admin_workflow(js_log: JetStreamLog, tmp_path: Path) -> None:
    home = tmp_path / "home"
    host = SimHost("host-1")
    await host.heartbeat(js_log)
    ctl = Controller(js_log, home, settings=SETTINGS, controller_id="ctl-cli")
    await ctl.start()
    admin = None
    try:
        admin = await serve_admin(ctl, "127.0.0.1", 0)
        url = admin.url
        assert (home / "admin.url").read_text().strip() == url
        rc, out, err = await gridctl(
            home, "model", "set", "SmolLM2.Q4.gguf", "--memory-mb", "600", "--runtime", "llama.cpp",
            "--runtime-memory-mb", "vllm=900", "--artifact-sha256", "AB" * 32, "--artifact-source",
            "hf://org/repo/SmolLM2.Q4.gguf", "--artifact-size-mb", "100", "--min-replicas", "1", "--max-replicas", "2",
            "--priority", "5", "--data-tier", "internal", "--required-tag", "gpu", "--forbidden-tag", "laptop",
            "--allow-host", "host-1", "--deny-host", "host-9", "--pin", "host-1", "--min-failure-domains", "1",
            "--max-colocated-models", "2", "--colocation-exclude", "other.gguf", "--workload-score", "coding=0.8",
            "--target-utilization", "0.6", "--expected-service-seconds", "3", "--latency-slo-ms", "900",
            "--replica-concurrency", "2", "--load-seconds", "20", "--warm-seconds", "5",
            "--min-residency-seconds", "120", "--scale-down-cooldown-seconds", "300", "--min-gpu-count", "0",
            "--min-gpu-memory-mb", "0", "--context-size", "4096",
        )
        assert rc == 0, err
        prof = ctl.runner["catalog"].profiles["SmolLM2.Q4.gguf"]
        assert prof.artifact_sha256 == "ab" * 32 and prof.runtime_memory_mb == {"vllm": 900}
        assert prof.workload_scores == {"coding": 0.8} and prof.pins == ("host-1",) and prof.context_size == 4096
        # A malformed profile is refused with the field at fault, nothing appended.
        rc, out, err = await gridctl(home, "model", "set", "bad", "--memory-mb", "10", "--artifact-source", "hf://x/y")
        assert rc != 0 and "--artifact-sha256" in err
        rc, out, err = await gridctl(home, "model", "set", "bad", "--memory-mb", "0")
        assert rc != 0 and "memory_mb" in err
        assert "bad" not in ctl.runner["catalog"].profiles
        rc, out, err = await gridctl(home, "mode", "observe")
        assert rc == 0 and ctl.runner["catalog"].mode == "observe"
        rc, out, err = await gridctl(home, "tick")
        assert rc == 0 and "observe" in out, out + err
        rc, out, err = await gridctl(home, "status")
        assert rc == 0, err
        for text in ("Hosts", "host-1", "Models", "SmolLM2.Q4.gguf", "mode observe"):
            assert text in out, out
        rc, out, err = await gridctl(home, "status", "--json")
        data = json.loads(out)
        assert data["mode"]["requested"] == "observe" and data["profiles"][0]["model_id"] == "SmolLM2.Q4.gguf"
        rc, out, err = await gridctl(home, "model", "remove", "SmolLM2.Q4.gguf")
        assert rc == 0 and "SmolLM2.Q4.gguf" in ctl.runner["catalog"].retired
        rc, out, err = await gridctl(home, "model", "rm", "SmolLM2.Q4.gguf")
        assert rc != 0 and "404" in err
        # Wrong token: refused.
        bad = tmp_path / "bad.token"
        bad.write_text("nope\n")
        bad.chmod(0o600)
        rc, out, err = await gridctl(home, "mode", "recommend", "--token-file", str(bad))
        assert rc != 0 and "unauthorized" in err
    finally:
        if admin is not None:
            await admin.stop()
        await ctl.stop()
    assert not (home / "admin.url").exists()
