"""A whole grid without a single point of failure, as real processes on a 3-node NATS cluster:
two `gridctl serve controller`, two `gridctl node start` agents running the real SmolLM2 in
real llama-server children, two `gridctl serve gateway`; every one of them given all three NATS
URLs. The tests run in order on one grid (each leaves it as the next expects):

1. exactly one controller holds the lease; `gridctl status` shows it active, the other standby;
2. SIGKILL the active controller during a scale-up: the standby takes over within the lease
   TTL with a higher term, the scale-up completes, no command is executed twice;
3. kill one gateway while clients stream through both: the survivor keeps serving;
4. SIGKILL a NATS node under the running grid: every component carries on (CLI included);
5. SIGSTOP the active controller past its lease: a third controller takes over; SIGCONT: the
   old one appends nothing (neither plan nor command) and steps down.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest

from grid.agent.artifacts import BUNDLED_MODEL_ID, BUNDLED_SHA256
from grid.agent.engines.runtime import Runtime
from grid.events import codec
from grid.events.acks import ActionAck
from grid.events.commands import CommandIssued
from grid.events.plan import PlanCreated
from grid.events.subjects import COMMANDS_STREAM, HOSTS_STREAM, PLANS_STREAM
from grid.transport.cluster import NatsCluster
from grid.transport.embedded import free_port
from grid.transport.jetstream import JetStreamLog
from tests.engineproc import runtime_arg
from tests.ports import engine_ports_arg

pytestmark = pytest.mark.engine

LEASE_TTL = 3.0
LEASE_RENEW = 0.5
MODEL = BUNDLED_MODEL_ID
GRIDCTL = [sys.executable, "-m", "grid.cli.main"]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    home: Path
    log: Path


@dataclass
class HAGrid:
    base: Path
    cluster: NatsCluster
    procs: dict[str, Proc] = field(default_factory=dict)
    gateway_urls: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.cluster.url

    def env(self, home: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRID_")}
        return {**env, "GRID_HOME": str(home)}

    def spawn(self, name: str, home: Path, *args: str) -> Proc:
        home.mkdir(parents=True, exist_ok=True)
        log = self.base / f"{name}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen([*GRIDCTL, *args], env=self.env(home), stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        proc = self.procs[name] = Proc(name, popen, home, log)
        return proc

    def controller(self, name: str) -> Proc:
        return self.spawn(name, self.base / name, "serve", "controller", "--nats", self.url, "--port", "0",
                          "--assume-durable", "--no-analytics", "--tick-interval", "0.5", "--lease-ttl", str(LEASE_TTL),
                          "--lease-renew", str(LEASE_RENEW), "--restart-grace", "0", "--publish-pause", "1.5",
                          "--log-format", "json")

    def gridctl(self, home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*GRIDCTL, *args], env=self.env(home), capture_output=True, text=True, timeout=timeout)

    def status(self, name: str) -> dict:  # type: ignore[type-arg]
        proc = self.gridctl(self.procs[name].home, "status", "--json")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.popen.pid, signal.SIGCONT)
                proc.popen.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.popen.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait(10)
        # An agent that had to be SIGKILLed leaves its engines (they run in their own session,
        # for adoption by the next agent): end every process still running from this grid's dirs.
        for p in psutil.process_iter(["pid", "cmdline"]):
            with contextlib.suppress(psutil.Error):
                if any(str(self.base) in arg for arg in p.info["cmdline"] or ()):
                    p.kill()


def wait(predicate, timeout: float, what: str, interval: float = 0.2):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (AssertionError, KeyError, ValueError, httpx.HTTPError) as exc:
            value, last = None, exc
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what} not within {timeout}s (last error: {last!r})")


def read_log(url: str):  # type: ignore[no-untyped-def]
    """(commands, acks, plans) now in the log, read through the cluster."""

    async def go():  # type: ignore[no-untyped-def]
        log = await JetStreamLog.connect(url, ensure_streams=False)
        try:
            cmds = [(m.seq, codec.decode(m.data)) async for m in log.replay(COMMANDS_STREAM)]
            hosts = [codec.decode(m.data) async for m in log.replay(HOSTS_STREAM)]
            plans = [(m.seq, codec.decode(m.data)) async for m in log.replay(PLANS_STREAM)]
        finally:
            await log.close()
        return ([(s, c) for s, c in cmds if isinstance(c, CommandIssued)],
                [a for a in hosts if isinstance(a, ActionAck)],
                [(s, p) for s, p in plans if isinstance(p, PlanCreated)])

    return asyncio.run(go())


def active_and_standby(status: dict) -> tuple[list[str], list[str]]:  # type: ignore[type-arg]
    rows = status["controllers"]
    return ([r["controller_id"] for r in rows if r["state"] == "active"],
            [r["controller_id"] for r in rows if r["state"] == "standby"])


def ready_replicas(status: dict) -> int:  # type: ignore[type-arg]
    return next((m["ready"] for m in status["models"] if m["model_id"] == MODEL), 0)


@pytest.fixture(scope="module")
def ha_grid(tmp_path_factory: pytest.TempPathFactory, bundled_model_home: Path,
            engine_runtime: Runtime) -> Iterator[HAGrid]:
    base = tmp_path_factory.mktemp("ha-grid")
    cluster = NatsCluster(base / "nats", nodes=3)
    cluster.start()
    grid = HAGrid(base, cluster)
    try:
        a = grid.controller("ctl-a")
        wait(lambda: (a.home / "admin.url").exists() and grid.status("ctl-a")["controller"]["lease"]["state"] == "held",
             30, "controller a active")
        grid.controller("ctl-b")
        wait(lambda: (grid.procs["ctl-b"].home / "admin.url").exists() and grid.status("ctl-b"), 30, "controller b up")
        assert grid.gridctl(a.home, "mode", "automatic").returncode == 0
        for i in (1, 2):
            home = base / f"agent-{i}"
            home.mkdir()
            (home / "artifacts").symlink_to(bundled_model_home / "artifacts")
            grid.spawn(f"agent-{i}", home, "node", "start", "--nats", grid.url, "--host-id", f"agent-{i}",
                       "--memory-mb", "8000", "--failure-domain", f"d{i}", "--port-range", engine_ports_arg(),
                       "--heartbeat-interval", "0.5", "--sample-interval", "0.5", "--log-format", "json",
                       "--runtime-binary", runtime_arg(engine_runtime))

        def hosts_fresh() -> bool:
            hosts = {h["host_id"]: h for h in grid.status("ctl-a")["hosts"]}
            return all(hosts.get(f"agent-{i}", {}).get("fresh") for i in (1, 2))

        wait(hosts_fresh, 60, "both agents registered")
        yield grid
    finally:
        grid.stop_all()
        cluster.stop()


def test_one_controller_is_active_and_status_shows_the_standby(ha_grid: HAGrid) -> None:
    a_id = ha_grid.status("ctl-a")["controller"]["id"]
    b_id = ha_grid.status("ctl-b")["controller"]["id"]

    def both_listed() -> bool:
        return all(active_and_standby(ha_grid.status(n)) == ([a_id], [b_id]) for n in ("ctl-a", "ctl-b"))

    wait(both_listed, 15, "status lists a active and b standby, from either controller")
    assert ha_grid.status("ctl-b")["controller"]["lease"]["state"] == "standby"
    # The human view names them too (its own read of the presence records, so waited for too).

    def text_names_both() -> bool:
        text = ha_grid.gridctl(ha_grid.procs["ctl-b"].home, "status").stdout
        return f"{a_id} active" in text and f"{b_id} standby" in text

    wait(text_names_both, 15, "the human status names a active and b standby")


def test_sigkill_the_active_controller_during_a_scale_up(ha_grid: HAGrid) -> None:
    a = ha_grid.procs["ctl-a"]
    a_id = ha_grid.status("ctl-a")["controller"]["id"]
    b_id = ha_grid.status("ctl-b")["controller"]["id"]
    set_ = ha_grid.gridctl(a.home, "model", "set", MODEL, "--memory-mb", "512", "--artifact-sha256", BUNDLED_SHA256,
                           "--min-replicas", "2", "--max-replicas", "2", "--min-residency-seconds", "0",
                           "--scale-down-cooldown-seconds", "0")
    assert set_.returncode == 0, set_.stderr
    # Commands go out one at a time, 1.5 s apart (the --publish-pause test seam): kill the
    # controller as soon as its first load is out, before its second.
    first = wait(lambda: [c for _, c in read_log(ha_grid.url)[0] if c.model_id == MODEL], 60, "first load command",
                 interval=0.05)
    os.killpg(a.popen.pid, signal.SIGKILL)
    a.popen.wait(10)
    killed_at = time.monotonic()
    assert len(first) == 1 and first[0].controller_id == a_id
    a_term = first[0].controller_term

    def b_active() -> bool:
        return ha_grid.status("ctl-b")["controller"]["lease"]["state"] == "held"

    wait(b_active, LEASE_TTL + 10, "standby takes over")
    took_over = time.monotonic() - killed_at
    assert took_over < LEASE_TTL + 3 * LEASE_RENEW + 3.0, took_over
    wait(lambda: ready_replicas(ha_grid.status("ctl-b")) == 2, 120, "scale-up completes under the new controller")
    cmds, acks, plans = read_log(ha_grid.url)
    loads = [c for _, c in cmds if c.model_id == MODEL]
    # One command per host and kind, ever: the new controller continued from the log instead
    # of re-issuing what the old one had issued.
    per_intent = collections.Counter((c.kind, c.host_id) for c in loads)
    assert {h for _, h in per_intent} == {"agent-1", "agent-2"} and set(per_intent.values()) == {1}, per_intent
    # No command executed twice: each action was accepted and finished at most once.
    per_action = collections.Counter((a.action_id, a.status) for a in acks if a.action_id in {c.action_id for c in loads})
    assert all(n == 1 for n in per_action.values()), per_action
    assert {s for (_, s) in per_action} >= {"succeeded"}
    # The term strictly increased at the takeover; nothing the old controller issued afterwards.
    b_cmds = [c for c in loads if c.controller_id == b_id]
    assert b_cmds and all(c.controller_term > a_term for c in b_cmds)
    assert all(p.controller_term > a_term for _, p in plans if p.controller_id == b_id)
    assert [c for c in loads if c.controller_id == a_id] == first


def _stream_chat(base_url: str, out: dict, key: str, started: threading.Event) -> None:  # type: ignore[type-arg]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count from one to forty in words."}],
            "stream": True, "max_tokens": 64}
    chunks = 0
    try:
        with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=60.0) as resp:
            out[key + ":status"] = resp.status_code
            for line in resp.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks += 1
                    started.set()
                if line == "data: [DONE]":
                    out[key] = ("done", chunks)
                    return
        out[key] = ("ended-early", chunks)
    except httpx.HTTPError as exc:
        out[key] = ("error", type(exc).__name__)
    finally:
        started.set()


def test_kill_one_gateway_while_clients_stream_through_the_other(ha_grid: HAGrid) -> None:
    ports = {}
    for name in ("gw-1", "gw-2"):
        ports[name] = free_port()
        ha_grid.spawn(name, ha_grid.base / name, "serve", "gateway", "--nats", ha_grid.url, "--port", str(ports[name]),
                      "--log-format", "json")
    urls = ha_grid.gateway_urls = {n: f"http://127.0.0.1:{p}" for n, p in ports.items()}

    def serving(name: str) -> bool:
        models = httpx.get(f"{urls[name]}/v1/models", timeout=5).json()
        return MODEL in {m["id"] for m in models["data"]}

    for name in urls:
        wait(lambda n=name: serving(n), 60, f"{name} routes the model")
    results: dict = {}  # type: ignore[type-arg]
    started = threading.Event()
    stream = threading.Thread(target=_stream_chat, args=(urls["gw-2"], results, "gw-2", started), daemon=True)
    stream.start()
    assert started.wait(60)
    assert "gw-2" not in results or results["gw-2"][0] == "done", results  # streaming, not failed
    gw1 = ha_grid.procs["gw-1"]
    os.killpg(gw1.popen.pid, signal.SIGKILL)
    gw1.popen.wait(10)
    stream.join(90)
    # The stream through the survivor finished whole.
    assert results["gw-2"][0] == "done" and results["gw-2"][1] > 0, results
    # And it keeps serving: a client whose gateway died retries on the survivor.
    retry = httpx.post(f"{urls['gw-2']}/v1/chat/completions", timeout=60,
                       json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
    assert retry.status_code == 200, retry.text


def connections_by_node(nodes: list) -> list[list[str]]:  # type: ignore[type-arg]
    """The client connection names each node serves (from its monitoring endpoint)."""
    out = []
    for node in nodes:
        connz = httpx.get(f"http://{node.host}:{node.monitor_port}/connz", timeout=2).json()
        out.append(sorted(c.get("name") or "" for c in connz.get("connections") or []))
    return out


def test_losing_a_nats_node_under_the_running_grid(ha_grid: HAGrid) -> None:
    b_id = ha_grid.status("ctl-b")["controller"]["id"]
    before, _, _ = read_log(ha_grid.url)
    # Kill the node the active controller is connected to (the others' clients fail over too).
    names = connections_by_node(ha_grid.cluster.nodes)
    victim = next(i for i, n in enumerate(names) if "grid-controller" in n)  # the one controller running
    on_victim = set(names[victim])
    ha_grid.cluster.kill(victim)
    try:
        time.sleep(LEASE_TTL)
        # The controller still holds the lease (or took it back): exactly one active.
        wait(lambda: active_and_standby(ha_grid.status("ctl-b"))[0] == [b_id], 30, "controller b active after node loss")

        def agents_fresh() -> bool:
            hosts = {h["host_id"]: h for h in ha_grid.status("ctl-b")["hosts"]}
            return all(hosts[f"agent-{i}"]["fresh"] and hosts[f"agent-{i}"]["heartbeat_age_seconds"] < 3 for i in (1, 2))

        wait(agents_fresh, 30, "agents heartbeat through the surviving nodes")
        def answers() -> bool:
            r = httpx.post(f"{ha_grid.gateway_urls['gw-2']}/v1/chat/completions", timeout=30,
                           json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
            return r.status_code == 200

        wait(answers, 30, "gateway answers after node loss")
        # The CLI, given every URL, reads the log with one node gone.
        tail = ha_grid.gridctl(ha_grid.procs["ctl-b"].home, "events", "tail", "--nats", ha_grid.url, "--stream",
                               HOSTS_STREAM, "-n", "3", "--json")
        assert tail.returncode == 0 and len(tail.stdout.splitlines()) == 3, tail.stderr
        # No duplicate effects: nothing re-issued.
        time.sleep(2.0)
        after, _, _ = read_log(ha_grid.url)
        assert [c.action_id for _, c in after] == [c.action_id for _, c in before]
        assert ready_replicas(ha_grid.status("ctl-b")) == 2
        # Whatever ran on the lost node is connected elsewhere now.
        alive = [n for i, n in enumerate(ha_grid.cluster.nodes) if i != victim]
        moved = {n for names_ in connections_by_node(alive) for n in names_}
        assert on_victim & {"grid-controller", "grid-agent", "grid-gateway"} <= moved
    finally:
        ha_grid.cluster.restart(victim)
        ha_grid.cluster.wait_jetstream(30, nodes=[victim])


def test_a_paused_controller_appends_nothing_after_the_standby_took_over(ha_grid: HAGrid) -> None:
    b = ha_grid.procs["ctl-b"]
    b_id = ha_grid.status("ctl-b")["controller"]["id"]
    c = ha_grid.controller("ctl-c")
    wait(lambda: (c.home / "admin.url").exists() and ha_grid.status("ctl-c"), 30, "controller c up")
    c_id = ha_grid.status("ctl-c")["controller"]["id"]
    wait(lambda: active_and_standby(ha_grid.status("ctl-c")) == ([b_id], [c_id]), 15, "c standing by")
    cmds, _, plans = read_log(ha_grid.url)
    last_cmd = max((s for s, _ in cmds), default=0)
    last_plan = max((s for s, _ in plans), default=0)
    os.killpg(b.popen.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        wait(lambda: ha_grid.status("ctl-c")["controller"]["lease"]["state"] == "held", LEASE_TTL + 10, "c takes over")
        # Not before b's lease ran out: b renewed it at most one renew interval before it was
        # stopped, and the lease runs a TTL from that renewal.
        assert time.monotonic() - stopped_at > LEASE_TTL - LEASE_RENEW
        # The new holder records its plan under its own term at once, though nothing changed.
        c_term = ha_grid.status("ctl-c")["controller"]["lease"]["term"]
        wait(lambda: [p for s, p in read_log(ha_grid.url)[2] if s > last_plan and p.controller_id == c_id
                      and p.controller_term == c_term], 10, "c's plan under its term")
        # Work for the new controller: scale down to one replica.
        down = ha_grid.gridctl(c.home, "model", "set", MODEL, "--min-replicas", "1", "--max-replicas", "1")
        assert down.returncode == 0, down.stderr
        wait(lambda: [x for s, x in read_log(ha_grid.url)[0] if s > last_cmd], 60, "c scales down")
    finally:
        os.killpg(b.popen.pid, signal.SIGCONT)
    # b wakes with stale state and its tick loop running: it must append nothing and step down.
    wait(lambda: ha_grid.status("ctl-b")["controller"]["lease"]["state"] != "held", 10, "b steps down")
    time.sleep(3.0)
    cmds, _, plans = read_log(ha_grid.url)
    assert [x for s, x in cmds if s > last_cmd and x.controller_id == b_id] == []
    assert [p for s, p in plans if s > last_plan and p.controller_id == b_id] == []
    assert all(x.controller_id == c_id for s, x in cmds if s > last_cmd)
    assert active_and_standby(ha_grid.status("ctl-b")) == ([c_id], [b_id])
    assert b.popen.poll() is None  # stepped down, still running as a standby
    # The agents' command consumers survived the node loss before: the scale-down is carried out.
    wait(lambda: ready_replicas(ha_grid.status("ctl-c")) == 1, 60, "the scale-down completes")
