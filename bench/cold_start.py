"""Cold start through the host agent vs a raw llama-server spawn, measured in the same run.

agent path: a warm CommandIssued appended to the log -> the agent verifies the cached GGUF
            (sha256), spawns llama-server with the engine key file, probes /health, and appends
            a heartbeat with the residency READY; the clock stops when that heartbeat is read
            back from the log.
baseline:   spawn the same llama-server binary with the same flags -> /health answers 200.

Both use the real SmolLM2-135M Q4_1 GGUF and the same 50 ms readiness poll. Rounds alternate so
drift on a shared machine hits both sides. Goal: median ratio <= 1.5.

    python bench/cold_start.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from grid.agent.artifacts import BUNDLED_MODEL_ID, BUNDLED_SHA256, ensure_bundled_model
from grid.agent.engines import llama_cpp
from grid.agent.engines.runtime import find_runtime
from grid.agent.sensors import FixedSensors
from grid.agent.service import AgentOptions, HostAgent
from grid.config import GridConfig
from grid.controller.issue import Issuer, command_issued
from grid.controller.reconcile import Action
from grid.events import codec
from grid.events.acks import TERMINAL_ACK_STATUSES, ActionAck
from grid.events.commands import CommandIssued
from grid.events.host import HostHeartbeat
from grid.events.plan import make_generation
from grid.events.subjects import HOSTS_STREAM
from grid.transport.embedded import EmbeddedNats
from grid.transport.jetstream import JetStreamLog

HOST = "bench-host"


def command(kind: str, seq: int) -> CommandIssued:
    # The bench stands in for the controller: its commands are issued the controller's way.
    action = Action(action_id=uuid.uuid4().hex, kind=kind, host_id=HOST, model_id=BUNDLED_MODEL_ID, memory_mb=400,
                    reason="bench", artifact_sha256=BUNDLED_SHA256, slots=1, context_size=2048)
    issuer = Issuer(controller_id="bench", controller_term=1, generation=make_generation("bench", seq, "d"))
    return command_issued(action, issuer, issued_at=time.time(), lease_remaining=60.0)


async def wait_event(sub, predicate, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = await sub.next(timeout=max(0.01, deadline - time.monotonic()))
        if msg is None:
            continue
        event = codec.decode(msg.data)
        if predicate(event):
            return event
    raise TimeoutError("event not seen in time")


async def agent_round(log: JetStreamLog, seq: int) -> float:
    sub = await log.subscribe(HOSTS_STREAM, start_seq=await log.last_sequence(HOSTS_STREAM) + 1)
    try:
        warm = command("warm", seq)
        t0 = time.perf_counter()
        await log.append(warm)
        await wait_event(sub, lambda e: isinstance(e, HostHeartbeat) and any(
            r.model_id == BUNDLED_MODEL_ID and r.state == "ready" for r in e.residencies))
        elapsed = time.perf_counter() - t0
        ack = await wait_event(sub, lambda e: isinstance(e, ActionAck) and e.action_id == warm.action_id
                               and e.status in TERMINAL_ACK_STATUSES)
        assert ack.status == "succeeded", ack
        for kind in ("drain", "unload"):
            cmd = command(kind, seq)
            await log.append(cmd)
            ack = await wait_event(sub, lambda e, c=cmd: isinstance(e, ActionAck) and e.action_id == c.action_id
                                   and e.status in TERMINAL_ACK_STATUSES)
            assert ack.status == "succeeded", ack
        return elapsed
    finally:
        await sub.close()


async def raw_round(binary: Path | tuple[str, ...], gguf: Path, key_file: Path, port: int, log_path: Path) -> float:
    spec = llama_cpp.EngineSpec(model_id=BUNDLED_MODEL_ID, model_path=gguf, port=port, key_file=key_file,
                                slots=1, context_size=2048)
    key = key_file.read_text().strip()
    async with httpx.AsyncClient(trust_env=False) as client:
        t0 = time.perf_counter()
        proc = llama_cpp.spawn(binary, spec, log_path)
        try:
            ok = await llama_cpp.wait_ready(client, spec.endpoint, key, timeout=60.0, alive=lambda: proc.poll() is None)
            elapsed = time.perf_counter() - t0
            assert ok, "raw llama-server did not become healthy"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return elapsed


async def main(rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="grid-bench-") as tmp:
        root = Path(tmp)
        nats = EmbeddedNats(root / "nats").start()
        config = GridConfig(home=root / "home", nats_url=nats.url)
        t = time.perf_counter()
        gguf = ensure_bundled_model(config)
        print(f"bundled model ready in {time.perf_counter() - t:.2f}s: {gguf.name}")
        runtime = find_runtime()  # the runtime an agent would use (xllamacpp by default)
        if runtime is None:
            sys.exit("no llama.cpp runtime: pip install xllamacpp")
        binary = runtime.command
        log = await JetStreamLog.connect(nats.url)
        agent = HostAgent(log, config, AgentOptions(host_id=HOST, port_range=(39500, 39599)),
                          sensor_source=FixedSensors())
        await agent.start()
        raw_key = root / "raw.key"
        raw_key.write_text(agent.paths.engine_key.read_text())
        raw_key.chmod(0o600)
        agent_s: list[float] = []
        raw_s: list[float] = []
        try:
            # One unmeasured round each warms the page cache for the GGUF and the binary.
            await agent_round(log, 0)
            await raw_round(binary, gguf, raw_key, 39600, root / "raw.log")
            for i in range(rounds):
                if i % 2 == 0:
                    agent_s.append(await agent_round(log, i + 1))
                    raw_s.append(await raw_round(binary, gguf, raw_key, 39600, root / "raw.log"))
                else:
                    raw_s.append(await raw_round(binary, gguf, raw_key, 39600, root / "raw.log"))
                    agent_s.append(await agent_round(log, i + 1))
        finally:
            await agent.stop(drain=True)
            await log.close()
            nats.stop()
    a_med, r_med = statistics.median(agent_s), statistics.median(raw_s)
    print(f"rounds: {rounds}")
    print(f"agent command -> READY heartbeat: median {a_med * 1000:.0f} ms  "
          f"(min {min(agent_s) * 1000:.0f}, max {max(agent_s) * 1000:.0f})")
    print(f"raw spawn -> /health ok:          median {r_med * 1000:.0f} ms  "
          f"(min {min(raw_s) * 1000:.0f}, max {max(raw_s) * 1000:.0f})")
    ratio = a_med / r_med
    print(f"ratio agent/raw (median): {ratio:.2f}  (goal <= 1.5: {'met' if ratio <= 1.5 else 'NOT met'})")
    print(f"ratio agent/raw (best of each, least disturbed by other load): {min(agent_s) / min(raw_s):.2f}")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(parser.parse_args().rounds))
