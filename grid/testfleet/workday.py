"""`gridctl test demo` with workload bindings: the adaptive workday on a running test fleet.

Real requests only, as in the focused flow (grid.testfleet.demo): the allocator is shown demand
the way users create it and nothing else. The day, each step a mix of genuine requests through
the gateway, each judged by the fleet's own status and log:

1. idle: one baseline replica, on a host too small for a specialist (when it sits on a larger
   one, the demo drains the larger hosts as an operator would, until it has moved), and no
   optional model live;
2. four workload classes (coding, research, marketing, sales) send `auto` requests; the allocator
   loads the coding specialist and the shared research/marketing/sales model on the two larger
   hosts, and both answer named calls;
3. a general surge (requests naming the baseline), while the four classes go on at a trickle,
   displaces both specialists and scales the baseline to three replicas;
4. the surge expires while research and marketing go on: the fleet returns to one baseline plus
   the shared model, with the coding specialist off;
5. cooldown: no requests; every optional model drains and unloads.

A workday in minutes needs short forecast windows, so the demo first sets the demand bucket
(`ForecastWindowSet`, 4 s by default: an evidence gate of one minute) and declares short
residency and cooldown times, and one model per host. Sizes come from the fleet's capacities: a
specialist is declared too big for any smaller host, and small enough for a larger host even
when a busy machine throttles it. Profiles with different names may share the
fleet's one GGUF: every process and answer is real while the profiles stand in for other models.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from grid.testfleet.demo import (
    GENERAL_PROMPTS,
    CODING_PROMPTS,
    LIVE_STATES,
    REQ_BASELINE_ONE_REPLICA,
    Answer,
    Demo,
    DemoReport,
    DemoSpec,
    Progress,
    Say,
    _describe,
    _hosts_in,
    send_chat,
)
from grid.testfleet.state import FleetError, FleetManifest

# The classes the workday binds, and the one among them served by its own specialist.
SPECIALIST_WORKLOAD = "coding"
SHARED_WORKLOADS = ("research", "marketing", "sales")
WORKDAY_WORKLOADS = (SPECIALIST_WORKLOAD, *SHARED_WORKLOADS)
# The classes still asking after the surge (the shared model returns, the specialist does not).
RETURN_WORKLOADS = ("research", "marketing")

PROMPTS: dict[str, tuple[str, ...]] = {
    "coding": CODING_PROMPTS,
    "research": ("Summarize the evidence of this study and the papers it cites.",
                 "Compare the methodology of two research papers in one sentence."),
    "marketing": ("Write a tagline for our brand's marketing campaign.",
                  "Suggest a headline for a newsletter about our campaign."),
    "sales": ("Draft a short sales pitch for a prospect in our pipeline.",
              "Write a follow-up email to a customer about pricing."),
    "general": GENERAL_PROMPTS,
}

# Requirement names (the report's rows; one failed row fails the workday).
REQ_FORECAST_WINDOW = "forecast_window_set"
REQ_BASELINE_ON_SMALL_HOST = "baseline_leaves_the_larger_hosts_free"
REQ_SPECIALISTS_PLACED = "specialist_and_shared_model_on_the_larger_hosts"
REQ_SPECIALISTS_ANSWER = "specialist_and_shared_model_answer"
REQ_SURGE = "surge_offloads_specialists_and_scales_the_baseline"
REQ_SURGE_ANSWERS = "surge_answered"
REQ_RETURN = "fleet_returns_after_the_surge"
REQ_RETURN_ANSWERS = "return_mix_answered"
REQ_COOLDOWN = "cooldown_unloads_every_optional_model"
REQ_LIFECYCLES = "optional_models_lifecycles_complete"

# The workday's time scale: the demand bucket (the forecast's windows are counts of them), and
# the residency rules of its profiles.
WORKDAY_BUCKET_SECONDS = 4.0
WORKDAY_MIN_RESIDENCY_SECONDS = 15.0
WORKDAY_COOLDOWN_SECONDS = 20.0
# The baseline outranks the specialists: a surge of direct demand for it may preempt them.
BASELINE_PRIORITY = 10
# A replica is sized for this share of one slot, so a few concurrent clients need three.
BASELINE_TARGET_UTILIZATION = 0.3
BASELINE_WORKDAY_SCORES = {"general": 0.8}
SPECIALIST_SCORE = 0.9
# A specialist is declared this much larger than the largest smaller host.
SPECIALIST_MARGIN_MB = 1
# What the workday declares for one baseline replica (SmolLM2-135M's engine stays below it).
BASELINE_WORKDAY_MEMORY_MB = 200
# The share of each host's memory the sizing leaves to processes that are not Grid's: a logical
# host reports its share of the machine's other processes (about a fifth on a busy machine).
UNMANAGED_ALLOWANCE_FRACTION = 0.25
# One model per host (each profile's max_colocated_models): a surge's baseline replica can only
# take a larger host by displacing its specialist.
MODELS_PER_HOST = 1

SURGE_CLIENTS = 4
MIX_PAUSE_SECONDS = 0.5
TRICKLE_PAUSE_SECONDS = 3.0


@dataclass(frozen=True)
class WorkdaySpec:
    # workload -> model: a GGUF path, or a name for another profile of the fleet's own artifact.
    bindings: dict[str, str]
    max_tokens: int = 16
    users: int = 3
    bucket_seconds: float = WORKDAY_BUCKET_SECONDS
    converge_timeout: float = 1200.0
    phase_timeout: float = 420.0


def parse_bindings(values: Sequence[str]) -> dict[str, str]:
    """`W=MODEL` options as a map; the workday needs exactly its four classes, coding on a model
    of its own and the other three on one shared model."""
    out: dict[str, str] = {}
    for value in values:
        workload, sep, model = value.partition("=")
        workload, model = workload.strip(), model.strip()
        if not sep or not workload or not model:
            raise FleetError(f"--workload-model takes WORKLOAD=MODEL, not {value!r}")
        if workload in out and out[workload] != model:
            raise FleetError(f"--workload-model binds {workload} twice ({out[workload]}, {model})")
        out[workload] = model
    if set(out) != set(WORKDAY_WORKLOADS):
        raise FleetError(f"the workday binds exactly {', '.join(WORKDAY_WORKLOADS)}; got {', '.join(sorted(out))}")
    shared = {out[w] for w in SHARED_WORKLOADS}
    if len(shared) != 1:
        raise FleetError(f"{', '.join(SHARED_WORKLOADS)} share one model; got {', '.join(sorted(shared))}")
    if out[SPECIALIST_WORKLOAD] in shared:
        raise FleetError("the coding specialist must be another model than the shared one")
    return out


def model_id_of(model: str) -> str:
    """The profile name a binding gives its model: a GGUF file's name, or the name itself."""
    return Path(model).name if model.endswith(".gguf") or "/" in model else model


@dataclass(frozen=True)
class Sizing:
    larger_hosts: tuple[str, ...]
    smaller_hosts: tuple[str, ...]
    specialist_mb: int


def size_specialists(capacities: dict[str, int], baseline_mb: int = BASELINE_WORKDAY_MEMORY_MB,
                     headroom_fraction: float = 0.05, throttle_fraction: float = 0.5) -> Sizing:
    """The two largest hosts hold a specialist each. A specialist is declared one MB larger than
    any smaller host, so it never fits there, and must still fit a larger host that is throttled
    (a busy machine offers new work only `throttle_fraction` of its capacity less what other
    processes use, and the planner keeps its admission headroom); the baseline must fit a
    throttled smaller host. That one model runs per host is the profiles' `max_colocated_models`, not
    memory. FleetError when the fleet's capacities cannot tell the hosts apart that way."""
    if len(capacities) < 3:
        raise FleetError("the workday needs three machines or more (a baseline host and two larger ones)")
    ordered = sorted(capacities, key=lambda h: (-capacities[h], h))
    larger, smaller = tuple(sorted(ordered[:2])), tuple(sorted(ordered[2:]))
    big = min(capacities[h] for h in larger)
    small = max(capacities[h] for h in smaller)
    least = min(capacities[h] for h in smaller)
    specialist = small + SPECIALIST_MARGIN_MB

    def fits_throttled(mb: int, capacity: int) -> bool:
        return mb * (1 + headroom_fraction) <= (throttle_fraction - UNMANAGED_ALLOWANCE_FRACTION) * capacity

    if small >= big or not fits_throttled(specialist, big) or not fits_throttled(baseline_mb, least):
        raise FleetError(
            f"the workday needs two hosts larger than the rest: start the fleet with e.g. --capacities-gib 1,5,5 "
            f"(capacities now {', '.join(f'{h}={capacities[h]} MB' for h in sorted(capacities))}; a specialist "
            f"of {specialist} MB, larger than any smaller host, must fit a throttled larger host, and the "
            f"{baseline_mb} MB baseline a throttled smaller host)")
    return Sizing(larger, smaller, specialist)


@dataclass
class Phase:
    name: str
    started_at: float
    finished_at: float = 0.0
    answers: list[Answer] = field(default_factory=list)
    detail: str = ""

    def counts(self) -> dict[str, int]:
        ok = sum(1 for a in self.answers if a.ok)
        return {"sent": len(self.answers), "answered": ok, "failed": len(self.answers) - ok,
                "retried": sum(1 for a in self.answers if a.attempts > 1)}


class Pump:
    """Clients sending a mix of requests until stopped, each after the previous answer."""

    def __init__(self, send: Callable[[str, str, str], Answer], jobs: Sequence[tuple[str, str, tuple[str, ...]]],
                 pause: float = MIX_PAUSE_SECONDS) -> None:
        self.send = send
        self.jobs = tuple(jobs)  # (persona, model, the workloads whose prompts it cycles through)
        self.pause = pause
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=len(self.jobs), thread_name_prefix="workday-client")

    def __enter__(self) -> Pump:
        for job in self.jobs:
            self._pool.submit(self._client, *job)
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._pool.shutdown(wait=True)

    def _client(self, persona: str, model: str, workloads: tuple[str, ...]) -> None:
        n = 0
        while not self._stop.is_set():
            prompts = PROMPTS[workloads[n % len(workloads)]]
            answer = self.send(persona, model, prompts[(n // len(workloads)) % len(prompts)])
            n += 1
            with self._lock:
                self.answers.append(answer)
            self._stop.wait(self.pause)

    def snapshot(self) -> list[Answer]:
        with self._lock:
            return list(self.answers)


class WorkdayDemo(Demo):
    """The adaptive workday; the focused flow's observation, answers and report are reused."""

    def __init__(self, state: FleetManifest, spec: WorkdaySpec, *, say: Say, progress: Progress,
                 on_line: Callable[[Any], None]) -> None:
        self.wspec = spec
        self.specialist = model_id_of(spec.bindings[SPECIALIST_WORKLOAD])
        self.shared = model_id_of(spec.bindings[SHARED_WORKLOADS[0]])
        super().__init__(state, DemoSpec(users=spec.users, max_tokens=spec.max_tokens,
                                         converge_timeout=spec.converge_timeout), say=say, progress=progress,
                         on_line=on_line)
        self.report.coding_model = self.specialist
        self.report.mode = "workday"
        self.optional = (self.specialist, self.shared)
        self.phases: list[Phase] = []
        self.sizing: Sizing | None = None
        # model -> (replicas, evidence, reason) of its last forecast target printed
        self._targets_seen: dict[str, tuple[Any, Any, Any]] = {}
        # model -> its last desired placements printed; host -> its last protection state printed
        self._placements_seen: dict[str, str] = {}
        self._host_states_seen: dict[str, str] = {}

    # --- requests ---

    def _send(self, persona: str, model: str, prompt: str) -> Answer:
        return send_chat(self.client, persona, model, prompt, self.spec.max_tokens)

    def _phase(self, name: str) -> Phase:
        phase = Phase(name, time.time())
        self.phases.append(phase)
        self.say(f"--- {name}")
        return phase

    def _end(self, phase: Phase, *answers: Answer, pumps: Sequence[tuple[Pump, int]] = ()) -> list[Answer]:
        """Close `phase` with `answers` and what each pump answered since its given count."""
        got = [*(a for pump, since in pumps for a in pump.snapshot()[since:]), *answers]
        phase.answers.extend(got)
        phase.finished_at = time.time()
        self.report.answers.extend(got)
        c = phase.counts()
        self.say(f"{phase.name}: {c['answered']} of {c['sent']} requests answered ({c['retried']} retried)")
        return got

    # --- observation ---

    def _live(self, status: dict[str, Any], model: str) -> set[str]:
        return _hosts_in(status, model, LIVE_STATES)

    def _ready(self, status: dict[str, Any], model: str) -> set[str]:
        return _hosts_in(status, model, {"ready"})

    def _shape(self, status: dict[str, Any]) -> str:
        """Where each model is, and for a model short of its replicas the plan's reason (so a
        requirement that failed says why the allocator did not get there)."""
        shortfalls = (status.get("plan") or {}).get("shortfalls") or []
        targets = {t.get("model_id"): t for t in (status.get("forecasts") or {}).get("targets") or []}
        rows = []
        for m in (self.baseline, *self.optional):
            row = f"{m} ready on {sorted(self._ready(status, m)) or '-'}, live on {sorted(self._live(status, m)) or '-'}"
            if m in targets:
                t = targets[m]
                row += f", wants {t.get('replicas')} ({t.get('evidence')}: {t.get('reason')})"
            short = [s for s in shortfalls if s.get("model_id") == m]
            if short:
                why = "; ".join(f"{s.get('reason')}: {s.get('detail')}" if s.get("detail") else str(s.get("reason"))
                                for s in short)
                row += f" (placed {short[0].get('placed')} of {short[0].get('wanted')}: {why})"
            rows.append(row)
        return "; ".join(rows)

    def _say_forecast_changes(self, status: dict[str, Any]) -> None:
        """Print each change of a model's forecast target: why the allocator wants what it wants."""
        for t in (status.get("forecasts") or {}).get("targets") or []:
            m = t.get("model_id")
            if m not in (self.baseline, *self.optional):
                continue
            now = (t.get("replicas"), t.get("evidence"), t.get("reason"))
            if self._targets_seen.get(m) != now:
                self._targets_seen[m] = now
                self.say(f"forecast {m}: {now[0]} replica(s), {now[1]} ({now[2]})")

    def _say_plan_changes(self, status: dict[str, Any]) -> None:
        """Print each change of a model's desired placements with the plan's reasons, and each
        change of a host's protection state: a model that moves says why it moved."""
        for h in status.get("hosts") or []:
            now = f"{h.get('state')} ({h.get('protection_reason') or '-'})"
            if not h.get("fresh"):
                now += f", heartbeat {h.get('heartbeat_age_seconds')} s old"
            if self._host_states_seen.get(h["host_id"], "accepting (-)") != now:
                self.say(f"host {h['host_id']}: {now}, unmanaged {h.get('unmanaged_mb')} MB, "
                         f"free {h.get('free_mb')} MB")
            self._host_states_seen[h["host_id"]] = now
        plan = status.get("plan") or {}
        explained = {e.get("model_id"): e for e in plan.get("explanations") or []}
        for m in (self.baseline, *self.optional):
            placed = sorted(f"{p.get('host_id')} {p.get('status')} ({p.get('reason')})"
                            for p in plan.get("placements") or [] if p.get("model_id") == m)
            now = ", ".join(placed) or "-"
            if self._placements_seen.get(m, "-") == now:
                continue
            self._placements_seen[m] = now
            rejected = [f"{v.get('host_id')} {v.get('reason')}" + (f" ({v.get('detail')})" if v.get("detail") else "")
                        for v in (explained.get(m) or {}).get("rejected") or []]
            self.say(f"plan {m}: {now}" + (f"; not on {'; '.join(rejected)}" if rejected else ""))

    def _until(self, what: str, probe: Callable[[dict[str, Any]], bool], timeout: float | None = None) -> bool:
        def check() -> bool:
            status = self._status()
            self._last_seen = self._shape(status)
            self._say_forecast_changes(status)
            self._say_plan_changes(status)
            return probe(status)

        return bool(self._wait(what, check, self.wspec.phase_timeout if timeout is None else timeout))

    # --- the day ---

    def _flow(self) -> None:
        r = self.report
        if not self._declare_workday():
            return
        self.say(f"baseline {self.baseline}: converging to one ready replica and no optional model")
        idle = self._until("one baseline replica, no optional model", self._idle_day, self.spec.converge_timeout)
        if not r.require(REQ_BASELINE_ONE_REPLICA, idle, self._last_seen):
            return
        assert self.sizing is not None
        if not self._at_home(self._status()):
            self._send_home()
        status = self._status()
        base_hosts = self._live(status, self.baseline)
        if not r.require(REQ_BASELINE_ON_SMALL_HOST, not base_hosts & set(self.sizing.larger_hosts),
                         f"baseline on {sorted(base_hosts)}; larger hosts {list(self.sizing.larger_hosts)}"):
            return
        jobs = [(f"{w}-user-{i + 1}", "auto", (w,)) for i, w in enumerate(WORKDAY_WORKLOADS)]
        with Pump(self._send, jobs) as mix:
            if not self._four_classes(mix):
                return
        # The four classes keep asking through the surge, at a trickle: it is the surge, not their
        # demand expiring, that must displace the specialists. (The planner preempts for a
        # scale-up only when the replica would serve more than its victims serve now.)
        with Pump(self._send, [("quiet-user", "auto", WORKDAY_WORKLOADS)], pause=TRICKLE_PAUSE_SECONDS) as trickle:
            if not self._surge(trickle):
                return
        if not self._return():
            return
        self._cooldown()

    def _declare_workday(self) -> bool:
        from grid.localgrid import bundled_profile

        r = self.report
        window = self.admin("PUT", "/allocator/forecast-window", {"bucket_seconds": self.wspec.bucket_seconds})
        r.require(REQ_FORECAST_WINDOW, window.get("bucket_seconds") == self.wspec.bucket_seconds,
                  f"demand buckets of {window.get('bucket_seconds')} s (evidence gate of 15 buckets)")
        settings = self.state.settings
        status = self._status()
        capacities = {h["host_id"]: int(h["capacity_mb"]) - int(h.get("reserved_mb") or 0)
                      for h in status["hosts"] if h["fresh"]}
        try:
            self.sizing = size_specialists(capacities)
        except FleetError as exc:
            r.require(REQ_SPECIALISTS_PLACED, False, str(exc))
            return False
        common = dict(min_residency_seconds=WORKDAY_MIN_RESIDENCY_SECONDS,
                      scale_down_cooldown_seconds=WORKDAY_COOLDOWN_SECONDS, max_colocated_models=MODELS_PER_HOST)
        profiles = [bundled_profile(model_id=self.baseline, artifact_sha256=settings.artifact_sha256,
                                    memory_mb=BASELINE_WORKDAY_MEMORY_MB, min_replicas=1,
                                    max_replicas=settings.machines, workload_scores=BASELINE_WORKDAY_SCORES,
                                    priority=BASELINE_PRIORITY, target_utilization=BASELINE_TARGET_UTILIZATION,
                                    **common)]
        for model, workloads in ((self.specialist, (SPECIALIST_WORKLOAD,)), (self.shared, SHARED_WORKLOADS)):
            sha = settings.artifact_sha256
            source = self.wspec.bindings[workloads[0]]
            if source.endswith(".gguf") or "/" in source:
                sha, _ = self._push(Path(source).expanduser())
            profiles.append(bundled_profile(model_id=model, artifact_sha256=sha, memory_mb=self.sizing.specialist_mb,
                                            min_replicas=0, max_replicas=1,
                                            workload_scores={w: SPECIALIST_SCORE for w in workloads}, **common))
        for profile in profiles:
            body = {k: v for k, v in msgspec.to_builtins(profile).items() if k != "model_id"}
            self.admin("PUT", f"/allocator/models/{profile.model_id}", body)
        self.say(f"declared {self.baseline} (general, priority {BASELINE_PRIORITY}), {self.specialist} (coding) and "
                 f"{self.shared} ({', '.join(SHARED_WORKLOADS)}), specialists {self.sizing.specialist_mb} MB: "
                 f"larger hosts {list(self.sizing.larger_hosts)}")
        return True

    def _idle_day(self, status: dict[str, Any]) -> bool:
        """One baseline replica and no optional model live."""
        return (len(self._live(status, self.baseline)) == len(self._ready(status, self.baseline)) == 1
                and not any(self._live(status, m) for m in self.optional))

    def _at_home(self, status: dict[str, Any]) -> bool:
        """Idle, with the baseline on a smaller host."""
        assert self.sizing is not None
        return self._idle_day(status) and self._live(status, self.baseline) <= set(self.sizing.smaller_hosts)

    def _host_override(self, verb: str, host_id: str) -> None:
        from grid.testfleet.fleet import _env, _gridctl

        args = [verb, host_id, "--nats", self.state.nats_url]
        if verb != "resume":
            args += ["--reason", "workday: the baseline starts on a smaller host", "--expires", "10m"]
        done = subprocess.run(_gridctl("host", *args), env=_env(Path(self.state.control_home)), capture_output=True,
                              text=True, timeout=120, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise FleetError(f"gridctl host {verb} {host_id} failed: {(done.stderr or done.stdout).strip()[-400:]}")
        self.say(f"gridctl host {verb} {host_id}")

    def _send_home(self) -> bool:
        """Move the baseline off the larger hosts by draining them (make-before-break), then release them."""
        assert self.sizing is not None
        larger = self.sizing.larger_hosts
        self.say(f"the baseline sits on a larger host: draining {', '.join(larger)} until it has moved")
        try:
            for host in larger:
                self._host_override("drain", host)
            return self._until("the baseline on a smaller host", self._at_home, self.spec.converge_timeout)
        finally:
            for host in larger:
                self._host_override("resume", host)

    def _four_classes(self, mix: Pump) -> bool:
        r = self.report
        assert self.sizing is not None
        larger = set(self.sizing.larger_hosts)
        phase = self._phase(f"four workload classes ({', '.join(WORKDAY_WORKLOADS)}) ask for model auto")

        def placed(status: dict[str, Any]) -> bool:
            a, b = self._ready(status, self.specialist), self._ready(status, self.shared)
            return bool(a) and bool(b) and (a | b) <= larger and not a & b

        ok = self._until(f"{self.specialist} and {self.shared} READY on the larger hosts", placed)
        named = [self._send("coding-user-1", self.specialist, PROMPTS["coding"][0]),
                 self._send("research-user-2", self.shared, PROMPTS["research"][0])] if ok else []
        self._end(phase, *named, pumps=[(mix, 0)])
        r.require(REQ_SPECIALISTS_PLACED, ok, self._last_seen)
        return r.require(REQ_SPECIALISTS_ANSWER, ok and all(a.ok for a in named),
                         "; ".join(_describe(a) for a in named) or "not asked: they never became ready")

    def _surge(self, mix: Pump) -> bool:
        r = self.report
        phase = self._phase(f"general surge: {SURGE_CLIENTS} clients name {self.baseline}")
        jobs = [(f"ops-{i + 1}", self.baseline, ("general",)) for i in range(SURGE_CLIENTS)]

        def scaled(status: dict[str, Any]) -> bool:
            return (len(self._ready(status, self.baseline)) >= 3
                    and not any(self._live(status, m) for m in self.optional))

        with Pump(self._send, jobs) as pump:
            ok = self._until(f"{self.baseline} on three hosts, both specialists offloaded", scaled)
        self._end(phase, pumps=[(pump, 0), (mix, 0)])
        r.require(REQ_SURGE, ok, self._last_seen)
        answers = pump.snapshot()
        answered = [a for a in answers if a.ok]
        return r.require(REQ_SURGE_ANSWERS, ok and bool(answered) and len({a.host_id for a in answered}) >= 2,
                         f"{len(answered)} of {len(answers)} answered, by {sorted({str(a.host_id) for a in answered})}")

    def _return(self) -> bool:
        r = self.report
        phase = self._phase(f"the surge expires; {', '.join(RETURN_WORKLOADS)} go on")
        jobs = [(f"{w}-user-{i + 1}", "auto", (w,)) for i, w in enumerate(RETURN_WORKLOADS)]

        def returned(status: dict[str, Any]) -> bool:
            return (len(self._ready(status, self.baseline)) == 1 and bool(self._ready(status, self.shared))
                    and not self._live(status, self.specialist))

        with Pump(self._send, jobs) as pump:
            ok = self._until(f"one {self.baseline}, {self.shared} back, {self.specialist} off", returned)
            named = [self._send("research-user-1", self.shared, PROMPTS["research"][1]),
                     self._send("ops-1", self.baseline, GENERAL_PROMPTS[0])] if ok else []
        self._end(phase, *named, pumps=[(pump, 0)])
        r.require(REQ_RETURN, ok, self._last_seen)
        return r.require(REQ_RETURN_ANSWERS, ok and all(a.ok for a in named),
                         "; ".join(_describe(a) for a in named) or "not asked: the fleet did not return")

    def _cooldown(self) -> None:
        r = self.report
        phase = self._phase("cooldown: no requests")
        ok = self._until("every optional model unloaded, one baseline replica", self._idle_day)
        self._end(phase)
        r.require(REQ_COOLDOWN, ok, self._last_seen)

    def _collect(self) -> None:
        self._collect_log()
        r = self.report
        r.phases = [{"name": p.name, "started_at": p.started_at, "finished_at": p.finished_at, **p.counts()}
                    for p in self.phases]
        if not any(q["name"] == REQ_COOLDOWN for q in r.requirements):
            return
        # Each optional model was loaded and became ready, and ended unloaded, on some host.
        paths = {}
        for model in self.optional:
            for host in sorted({t.host_id for t in r.transitions if t.model_id == model}):
                steps = [t for t in r.transitions if t.model_id == model and t.host_id == host]
                paths[f"{host}/{model}"] = [steps[0].before, *(t.after for t in steps)]
        complete = all(any(k.endswith(f"/{m}") and "ready" in p and p[-1] not in LIVE_STATES
                           for k, p in paths.items()) for m in self.optional)
        r.require(REQ_LIFECYCLES, complete, "; ".join(f"{k}: {' -> '.join(p)}" for k, p in paths.items())
                  or "no transition of an optional model seen")


def run_workday(state: FleetManifest, spec: WorkdaySpec, *, say: Say = lambda _: None,
                progress: Progress = lambda *_: None, on_line: Callable[[Any], None] = lambda _: None) -> DemoReport:
    if spec.max_tokens < 1:
        raise FleetError("--max-tokens must be >= 1")
    if not state.ready:
        raise FleetError("the test fleet is not ready (`gridctl test start` waits until it is)")
    names = {model_id_of(m) for m in spec.bindings.values()}
    if state.settings.model_id in names:
        raise FleetError(f"{state.settings.model_id} is the fleet's baseline; bind the workloads to other models")
    return WorkdayDemo(state, spec, say=say, progress=progress, on_line=on_line).run()
