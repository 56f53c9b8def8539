"""`gridctl engine add | ls | rm | discover` against a real llama-server started outside Grid with an
API key: discovery proposing only, registration per kind (a request for the operator's admission,
printed as the command to run), a missing key refused, the owner-only registry, removal, and the
probe's verdict on a stopped (SIGSTOP) engine and on one that is gone."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from grid.agent import external
from grid.agent.engines.runtime import Runtime
from grid.projections.routes import url_fingerprint
from grid.transport.embedded import free_port

pytestmark = [pytest.mark.integration, pytest.mark.engine]

MODEL = "smol-external"


def gridctl(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GRID_AGENT_STATE_DIR",)} | {
        "GRID_HOME": str(state_dir.parent), "COLUMNS": "300"}
    return subprocess.run([sys.executable, "-m", "grid.cli.main", "engine", *args, "--state-dir", str(state_dir)],
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "engine.key"
    path.write_text("sk-cli-test\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def engine(tmp_path: Path, key_file: Path, bundled_gguf: Path,
           engine_runtime: Runtime) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "engine.log").open("wb")
    proc = subprocess.Popen([*engine_runtime.command, "--model", str(bundled_gguf), "--host", "127.0.0.1", "--port",
                             str(port), "--alias", MODEL, "--api-key-file", str(key_file), "--ctx-size", "512", "--threads", "1", "--no-webui"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "engine.log").read_text()[-2000:]
            try:
                if httpx.get(url + "/health", timeout=1, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the llama-server did not become healthy"
            time.sleep(0.2)
        yield proc, url
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait(timeout=30)
        log.close()


def _ls(state_dir: Path) -> list[dict[str, object]]:
    done = gridctl(state_dir, "ls", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["engines"]


def test_register_list_and_remove_an_engine(tmp_path: Path, key_file: Path,
                                            engine: tuple[subprocess.Popen[bytes], str]) -> None:
    proc, url = engine
    state_dir = tmp_path / "agent"
    assert _ls(state_dir) == []
    # Discovery only proposes: the keyed engine is found, wants a key, and nothing is registered.
    port = url.rsplit(":", 1)[1]
    found = gridctl(state_dir, "discover", "--port", f"{port}:llama.cpp", "--port", str(free_port()), "--json")
    assert found.returncode == 0, found.stderr
    (proposal,) = json.loads(found.stdout)["engines"]
    assert (proposal["url"], proposal["kind"], proposal["probe"]) == (url, "llama.cpp", external.PROBE_KEY_REFUSED)
    assert proposal["propose"] == [f"gridctl engine add {url} --model MODEL --kind llama.cpp --api-key-file KEY_FILE"]
    assert _ls(state_dir) == []
    refused = gridctl(state_dir, "add", url, "--model", MODEL, "--kind", "openai")
    assert refused.returncode == 1 and external.PROBE_KEY_REFUSED in refused.stderr
    key = ("--api-key-file", str(key_file))
    for kind in ("openai", "llama.cpp"):
        added = gridctl(state_dir, "add", url + "/", "--model", MODEL, "--kind", kind, *key)
        assert added.returncode == 0, added.stderr
        # A registration is a request: without the operator's credential here, it prints the
        # operator's command (the endpoint by its fingerprint; no agent ran here, so no host id yet).
        assert "takes no traffic until an operator admits it" in added.stdout, added.stdout
        assert (f"gridctl engine admit HOST {MODEL} --kind {kind} --url-fingerprint {url_fingerprint(url)}"
                in added.stdout), added.stdout
        assert "sk-cli-test" not in added.stdout + added.stderr
    # One registration per model: the second replaced the first.
    (row,) = _ls(state_dir)
    assert (row["model_id"], row["url"], row["kind"], row["probe"], row["api_key_file"]) == (
        MODEL, url, "llama.cpp", external.PROBE_OK, str(key_file))
    assert stat.S_IMODE(external.registry_path(state_dir).stat().st_mode) == 0o600
    table = gridctl(state_dir, "ls")
    assert table.returncode == 0 and MODEL in table.stdout and url in table.stdout

    refused = gridctl(state_dir, "add", url, "--model", MODEL, "--kind", "tgi", *key)
    assert refused.returncode == 1 and "--kind must be one of" in refused.stderr

    # A stopped engine answers nothing: the probe times out (the agent's verdict, shown by ls).
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        assert _ls(state_dir)[0]["probe"] == external.PROBE_TIMEOUT
        refused = gridctl(state_dir, "add", url, "--model", MODEL, "--kind", "openai", *key)
        assert refused.returncode == 1 and external.PROBE_TIMEOUT in refused.stderr
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    assert _ls(state_dir)[0]["probe"] == external.PROBE_OK

    removed = gridctl(state_dir, "rm", MODEL)
    assert removed.returncode == 0 and "keeps running" in removed.stdout
    assert _ls(state_dir) == [] and proc.poll() is None
    missing = gridctl(state_dir, "rm", MODEL)
    assert missing.returncode == 1 and external.REG_NOT_FOUND in missing.stderr

    # Gone: refused as unreachable.
    proc.kill()
    proc.wait(timeout=30)
    refused = gridctl(state_dir, "add", url, "--model", MODEL, "--kind", "openai", *key)
    assert refused.returncode == 1 and external.PROBE_UNREACHABLE in refused.stderr


async def test_a_refused_connect_to_an_external_engine_wakes_the_prober(tmp_path: Path) -> None:
    from grid.agent.engine_client import H1EngineClient

    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    engines = external.ExternalEngines(tmp_path)
    reg = external.validate(MODEL, closed, "openai", 0, None)
    assert isinstance(reg, external.Registration)
    engines.update([(reg, external.ProbeResult(external.PROBE_OK), None)], 0.0)
    woken: list[int] = []
    client = external.WatchedEngineClient(H1EngineClient(connect_timeout=2.0), engines, lambda: woken.append(1))
    try:
        with pytest.raises(httpx.ConnectError):
            await client.post(closed + "/v1/chat/completions", b"{}", [])
        assert woken == [1]
        # A Grid engine's failed connect is not the prober's business.
        other = f"http://127.0.0.1:{free_port()}"
        with pytest.raises(httpx.ConnectError):
            await client.post(other + "/v1/chat/completions", b"{}", [])
        assert woken == [1]
    finally:
        await client.aclose()


async def test_a_probe_round_skips_an_engine_in_backoff_and_keeps_its_last_verdict(tmp_path: Path) -> None:
    reg = external.validate("smol", f"http://127.0.0.1:{free_port()}", "openai", 0, None)
    assert isinstance(reg, external.Registration)
    external.save(tmp_path, [reg])
    engines = external.ExternalEngines(tmp_path)
    async with httpx.AsyncClient() as http:
        assert await engines.probe_all(http, 100.0)  # registered, and nothing answers
        first = engines.engines["smol"]
        assert first.failing_since == 100.0 and first.result.reason == external.PROBE_UNREACHABLE
        assert not await engines.probe_all(http, 100.5)  # not due: not probed, verdict kept
        assert engines.engines["smol"] is first
        await engines.probe_all(http, first.next_probe_at)
        again = engines.engines["smol"]
        assert again is not first and again.failing_since == 100.0  # probed: the same outage goes on
