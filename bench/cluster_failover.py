"""Failover on the README's scaled-out grid, with real processes.

The grid is the one the README's "Scale out" section tells users to run: `gridctl nats
cluster-config --nodes 3` for three hosts (network namespaces here), `nats-server -c` on each
(TLS, operator mode, route TLS and secret, fsync always), every component given the three
`tls://` URLs with its own credential, agents that joined by invitation running the default
runtime (xllamacpp's server) with the bundled SmolLM2 GGUF (bench._cluster_grid).

1. Controller death: two `gridctl serve controller`, each with its own grid home and the same
   authority; SIGKILL the active one and time until the standby's first plan is in the log (it
   follows the lease: at most one TTL of waiting, then a tick). Repeated, alternating which one
   dies; the figure is set against the lease TTL (the baseline: a takeover cannot come sooner
   without risking two writers).
2. NATS node faults under traffic: a client sends short chat requests back to back through the
   gateway; the node the gateway is connected to is (a) SIGKILLed, later restarted, and (b) made
   silent (every packet to and from its namespace dropped, the process running on). Per fault:
   requests that failed, whether each succeeded when the client retried it once, the longest
   gap between successes, and the success rate against the same client's before the fault.

    python -m bench.cluster_failover [--rounds 3] [--lease-ttl 5] [--seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from bench._cluster_grid import MODEL, ClusterGrid, wait
from grid.events import codec
from grid.events.plan import PlanCreated
from grid.events.subjects import PLANS_STREAM
from grid.identity.connect import connect_log
from grid.identity.local import local_credential, local_tls_ca


def lease_held(grid: ClusterGrid, home: Path) -> bool:
    out = grid.gridctl("status", "--json", home=home)
    return out.returncode == 0 and json.loads(out.stdout)["controller"]["lease"]["state"] == "held"


def controller_id(home: Path) -> str:
    return (home / "controller" / "id").read_text().strip()


async def _operator_log(grid: ClusterGrid):  # type: ignore[no-untyped-def]
    return await connect_log(grid.url, credentials=local_credential(grid.home, "operator"),
                             tls_ca=local_tls_ca(grid.home), name="bench-reader", ensure_streams=False)


async def first_plan_by(grid: ClusterGrid, cid: str, after_seq: int, timeout: float) -> float | None:
    """Monotonic time at which a plan by `cid` past `after_seq` is first seen in the log."""
    log = await _operator_log(grid)
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


async def last_plan_seq(grid: ClusterGrid) -> int:
    log = await _operator_log(grid)
    try:
        return await log.last_sequence(PLANS_STREAM)
    finally:
        await log.close()


def controller_failover(base: Path, rounds: int, ttl: float, renew: float) -> None:
    grid = ClusterGrid(base)
    try:
        grid.start_nats()
        homes = {"ctl-a": grid.home, "ctl-b": base / "ctl-b"}
        # The second controller: its own grid home, the same authority (README "Controllers").
        shutil.copytree(grid.home / "identity", homes["ctl-b"] / "identity")

        def controller(name: str) -> None:
            grid.spawn(name, "serve", "controller", "--nats", grid.url, "--port", "0", "--no-analytics",
                       "--tick-interval", "1", "--lease-ttl", str(ttl), "--lease-renew", str(renew),
                       "--restart-grace", "0", "--log-format", "json", home=homes[name])

        names = ["ctl-a", "ctl-b"]
        controller("ctl-a")
        wait(lambda: lease_held(grid, homes["ctl-a"]), 90, "ctl-a active")
        controller("ctl-b")
        wait(lambda: (homes["ctl-b"] / "admin.url").exists(), 60, "ctl-b up")
        # Something to plan for: a model the fleet cannot place yet (plans record it).
        assert grid.gridctl("model", "set", "bench-model", "--memory-mb", "512", "--min-replicas", "1",
                            home=homes["ctl-a"]).returncode == 0
        time.sleep(2 * renew + 1)
        to_first_plan = []
        for r in range(rounds):
            active, standby = names[r % 2], names[(r + 1) % 2]
            wait(lambda: lease_held(grid, homes[active]), 60, f"{active} active")
            after = asyncio.run(last_plan_seq(grid))
            cid = controller_id(homes[standby])
            killed_at = time.monotonic()
            grid.kill(active)
            seen = asyncio.run(first_plan_by(grid, cid, after, ttl * 4 + 10))
            if seen is None:
                print(f"round {r + 1}: no plan by the standby within {ttl * 4 + 10:.0f}s")
                continue
            to_first_plan.append(seen - killed_at)
            (homes[active] / "admin.url").unlink(missing_ok=True)
            controller(active)  # back as the standby for the next round
            wait(lambda a=active: (homes[a] / "admin.url").exists(), 60, f"{active} back")
        if to_first_plan:
            mean = sum(to_first_plan) / len(to_first_plan)
            print(f"controller death -> standby's first plan: mean {mean:.2f}s, max {max(to_first_plan):.2f}s "
                  f"over {len(to_first_plan)} rounds; ratio to lease TTL {ttl:.1f}s = {mean / ttl:.2f} "
                  f"(renew every {renew:.1f}s; a takeover waits one TTL of silence on the standby's clock)", flush=True)
    finally:
        grid.stop()


def traffic(grid: ClusterGrid, seconds: float, fault: Callable[[], None]) -> str:
    """Back-to-back chats for `seconds`; `fault()` a third of the way in. A failed request is
    retried once. Returns the printed line's figures."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    url = f"{grid.gateway_url}/v1/chat/completions"
    results: list[tuple[float, bool]] = []  # (end, ok)
    failed = retried_ok = 0
    fault_at = time.monotonic() + seconds / 3
    end = time.monotonic() + seconds
    faulted_at = 0.0
    slowest = 0.0
    with httpx.Client(timeout=60) as client:
        while time.monotonic() < end:
            if not faulted_at and time.monotonic() >= fault_at:
                fault()
                faulted_at = time.monotonic()
            t0 = time.monotonic()
            try:
                ok = client.post(url, json=body).status_code == 200
            except httpx.HTTPError:
                ok = False
            results.append((time.monotonic(), ok))
            slowest = max(slowest, time.monotonic() - t0)
            if not ok:
                failed += 1
                try:
                    retried_ok += client.post(url, json=body).status_code == 200
                except httpx.HTTPError:
                    pass
    before = [ok for t, ok in results if t < faulted_at]
    after = [ok for t, ok in results if t >= faulted_at]
    rate_before = sum(before) / max(1e-9, faulted_at - (end - seconds))
    rate_after = sum(after) / max(1e-9, end - faulted_at)
    marks = [faulted_at, *[t for t, ok in results if ok and t >= faulted_at], end]
    gap = max(b - a for a, b in zip(marks, marks[1:]))
    return (f"{len(results)} requests, {failed} failed, {retried_ok}/{failed} succeeded on one retry; "
            f"longest gap between successes after the fault {gap:.2f}s; slowest request {slowest:.2f}s; "
            f"successes/s after the fault {rate_after:.2f} vs {rate_before:.2f} before (ratio "
            f"{rate_after / rate_before if rate_before else float('nan'):.2f})")


def node_faults(base: Path, seconds: float) -> None:
    grid = ClusterGrid(base)
    try:
        grid.start_nats()
        grid.start_grid(agents=1)

        victim = wait(lambda: grid.node_of("grid-gateway"), 10, "the gateway's node")
        line = traffic(grid, seconds, lambda: grid.kill_node(victim))
        print(f"NATS node SIGKILL under traffic (the gateway's node, grid-n{victim + 1}, {seconds / 3:.0f}s in): "
              f"{line}", flush=True)
        grid.restart_node(victim)

        victim = wait(lambda: grid.node_of("grid-gateway"), 10, "the gateway's node")
        line = traffic(grid, seconds, lambda: grid.network.silence(victim))
        print(f"NATS node silent under traffic (the gateway's node, grid-n{victim + 1}, every packet dropped "
              f"{seconds / 3:.0f}s in): {line}", flush=True)
    finally:
        grid.stop()


def main() -> None:
    p = argparse.ArgumentParser(description="Failover on the README's scaled-out grid.")
    p.add_argument("--rounds", type=int, default=3, help="Controller kills.")
    p.add_argument("--lease-ttl", type=float, default=5.0, help="Controllers' lease TTL in seconds.")
    p.add_argument("--lease-renew", type=float, default=1.0, help="Controllers' lease renewal interval in seconds.")
    p.add_argument("--seconds", type=float, default=30.0, help="Traffic per NATS node fault, in seconds.")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="grid-bench-failover-") as d:
        controller_failover(Path(d) / "controllers", a.rounds, a.lease_ttl, a.lease_renew)
        node_faults(Path(d) / "node-faults", a.seconds)


if __name__ == "__main__":
    main()
