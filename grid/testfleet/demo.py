"""`gridctl test demo`: the focused coding flow on a running test fleet, with real requests only.

The allocator is shown demand the way users create it (genuine OpenAI-compatible requests through
the gateway) and nothing else: no synthetic inference, no injected demand, no forecast written
by hand. The flow:

1. the baseline (the fleet's model, declared as a non-coding model) converges to one ready replica
   and answers;
2. distinct users send coding requests for model `auto`; no ready model serves coding, so each
   gets an honest 503 while the gateway records the classified demand;
3. after the forecast's evidence threshold the allocator loads and warms the coding model (a
   canary) before any request names it;
4. the first request naming the coding model answers;
5. personas with stable affinity keys send concurrent requests to both models, retrying a
   bounded number of times as a production client would.

Every residency transition and command is printed as the fleet's log reports it. The report holds
each answer's id and usage, the client-visible latency including retries, per-host performance
samples measured at the client, the lifecycle of every residency, and one row per requirement;
any failed requirement fails the demo. Observed demand expires on its own: the demo never clears it.

Only one GGUF ships with Grid, so by default the coding model is a second profile (another name,
its own workload scores) of the same artifact: every process and answer is real while the
profile stands in for a different model. `coding_model` names any other GGUF instead.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec

from grid.gateway.affinity import HEADER as AFFINITY_HEADER
from grid.testfleet.state import FleetError, FleetManifest

# Requirement names (the report's rows; one failed row fails the demo).
REQ_BASELINE_ONE_REPLICA = "baseline_converged_to_one_replica"
REQ_BASELINE_ANSWERS = "baseline_answers"
REQ_AUTO_HONEST_503 = "auto_coding_gets_honest_503"
REQ_CODING_WARMED_UNNAMED = "coding_model_warmed_before_named"
REQ_CODING_ANSWERS = "named_coding_call_answers"
REQ_PERSONAS_ANSWERED = "personas_answered"
REQ_ANSWERS_COMPLETE = "answers_have_id_usage_and_text"
REQ_PERFORMANCE_SAMPLES = "per_host_performance_samples"
REQ_LIFECYCLE = "coding_lifecycle_complete"

CODING_SUFFIX = "-coding"
# The baseline scores only non-coding classes (and not "general", which `auto` falls back to for
# any text workload): coding requests for `auto` then have no ready model until the allocator
# places the coding model.
BASELINE_SCORES = {"research": 0.4, "marketing": 0.4, "sales": 0.4}
CODING_SCORES = {"coding": 0.9}
# The demo's residency rules: a replica stays at least this long once ready (long enough for the
# personas to use it), and the fleet returns to one baseline replica within a minute or so of the
# demand that raised it instead of the production default's five minutes.
DEMO_MIN_RESIDENCY_SECONDS = 20.0
DEMO_COOLDOWN_SECONDS = 60.0
# States in which a residency serves, or soon will: the coding model in any of them means a
# previous run's demand is still held, and `auto` coding would not be refused.
LIVE_STATES = frozenset({"loading", "warming", "ready"})

CODING_PROMPTS = (
    "```python\ndef add(a, b):\n    return a + b\n```\nWrite a unit test for this function.",
    "```python\nimport json\ndef load(path):\n    return json.load(open(path))\n```\nWhat happens on a missing file?",
    "Traceback (most recent call last):\n  File \"app.py\", line 3\n```python\ndef main():\n    return run()\n```\n"
    "Explain this error.",
    "```python\nclass Stack:\n    def push(self, x):\n        self.items.append(x)\n```\nFind the bug.",
)
GENERAL_PROMPTS = (
    "Reply with OK.",
    "Name one colour of the sky.",
    "Say hello in French.",
    "What is two plus two?",
)

# Bounded, production-style retries: a retryable status waits its Retry-After (capped) and tries
# again, at most this many attempts in all.
MAX_ATTEMPTS = 4
MAX_RETRY_WAIT_SECONDS = 3.0
RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})
HTTP_TIMEOUT_SECONDS = 120.0

Say = Callable[[str], None]
Progress = Callable[[str, float, float], None]  # (what, elapsed seconds, timeout seconds)


@dataclass(frozen=True)
class DemoSpec:
    users: int = 3
    requests: int = 12
    max_tokens: int = 16
    # Another GGUF to serve as the coding model; None: a second profile of the fleet's artifact.
    coding_model: Path | None = None
    # A previous run's coding demand keeps its model for the forecast window (15 one-minute
    # buckets) and the cooldown after it.
    converge_timeout: float = 1200.0
    warm_timeout: float = 240.0


@dataclass
class Answer:
    """One client request as the client saw it (no prompt or response text is kept)."""

    persona: str
    model: str  # as named in the request
    served_model: str | None
    host_id: str | None
    status: int
    attempts: int
    latency_ms: float  # client-visible, first attempt to final answer, retries included
    response_id: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    content_chars: int = 0
    reason: str | None = None  # the gateway's X-Grid-Reason on a refusal

    @property
    def ok(self) -> bool:
        return (self.status == 200 and bool(self.response_id) and self.completion_tokens is not None
                and self.prompt_tokens is not None and self.content_chars > 0)


@dataclass
class ResidencyTransition:
    at: float
    host_id: str
    model_id: str
    before: str
    after: str


@dataclass
class DemoReport:
    baseline_model: str
    coding_model: str
    requirements: list[dict[str, Any]] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)
    transitions: list[ResidencyTransition] = field(default_factory=list)
    commands: list[dict[str, Any]] = field(default_factory=list)
    # Every line the fleet's log produced while the demo ran, in order (transitions, commands, outcomes).
    timeline: list[dict[str, Any]] = field(default_factory=list)
    coding_workload: dict[str, Any] | None = None
    # "coding": the focused coding flow; "workday": the adaptive workday (grid.testfleet.workday),
    # whose steps are listed in `phases` with their request counts.
    mode: str = "coding"
    phases: list[dict[str, Any]] = field(default_factory=list)
    started_at: float = 0.0
    finished_at: float = 0.0

    @property
    def passed(self) -> bool:
        return bool(self.requirements) and all(r["ok"] for r in self.requirements)

    def require(self, name: str, ok: bool, detail: str) -> bool:
        self.requirements.append({"name": name, "ok": bool(ok), "detail": detail})
        return bool(ok)

    def lifecycles(self) -> dict[str, list[dict[str, Any]]]:
        """Every residency's transitions, in order, keyed "host/model"."""
        out: dict[str, list[dict[str, Any]]] = {}
        for t in self.transitions:
            out.setdefault(f"{t.host_id}/{t.model_id}", []).append(
                {"at": t.at, "from": t.before, "to": t.after})
        return dict(sorted(out.items()))

    def performance(self) -> dict[str, dict[str, Any]]:
        """Per host and model: the client-measured samples of its successful answers."""
        groups: dict[tuple[str, str], list[Answer]] = {}
        for a in self.answers:
            if a.ok and a.host_id and a.served_model:
                groups.setdefault((a.host_id, a.served_model), []).append(a)
        out: dict[str, dict[str, Any]] = {}
        for (host, model), rows in sorted(groups.items()):
            lat = sorted(a.latency_ms for a in rows)
            tokens = sum(a.completion_tokens or 0 for a in rows)
            seconds = sum(a.latency_ms for a in rows) / 1000.0
            out.setdefault(host, {})[model] = {
                "samples": len(rows), "p50_latency_ms": round(lat[len(lat) // 2], 1),
                "max_latency_ms": round(lat[-1], 1), "completion_tokens": tokens,
                "tokens_per_second": round(tokens / seconds, 2) if seconds > 0 else None,
            }
        return out

    def counts(self) -> dict[str, Any]:
        by_model: dict[str, dict[str, int]] = {}
        for a in self.answers:
            row = by_model.setdefault(a.model, {"sent": 0, "answered": 0, "refused": 0, "retried": 0})
            row["sent"] += 1
            row["answered" if a.ok else "refused"] += 1
            row["retried"] += 1 if a.attempts > 1 else 0
        return dict(sorted(by_model.items()))

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed, "mode": self.mode, "phases": self.phases,
            "baseline_model": self.baseline_model, "coding_model": self.coding_model,
            "started_at": self.started_at, "finished_at": self.finished_at,
            "requirements": self.requirements, "counts": self.counts(),
            "answers": [{**msgspec.to_builtins(_answer_struct(a)), "ok": a.ok} for a in self.answers],
            "performance": self.performance(), "lifecycles": self.lifecycles(),
            "commands": self.commands, "timeline": self.timeline, "coding_workload": self.coding_workload,
        }


class _AnswerRow(msgspec.Struct, kw_only=True):
    persona: str
    model: str
    served_model: str | None
    host_id: str | None
    status: int
    attempts: int
    latency_ms: float
    response_id: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    content_chars: int
    reason: str | None


def _answer_struct(a: Answer) -> _AnswerRow:
    return _AnswerRow(persona=a.persona, model=a.model, served_model=a.served_model, host_id=a.host_id,
                      status=a.status, attempts=a.attempts, latency_ms=round(a.latency_ms, 1),
                      response_id=a.response_id, prompt_tokens=a.prompt_tokens,
                      completion_tokens=a.completion_tokens, content_chars=a.content_chars, reason=a.reason)


# --- the fleet's log, followed while the demo runs ----------------------------------------------


class Follower:
    """Residency transitions and commands from the fleet's log, on a thread of its own."""

    def __init__(self, state: FleetManifest, on_line: Callable[[Any], None]) -> None:
        self.state = state
        self.on_line = on_line
        self.lines: list[Any] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="demo-follower", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def snapshot(self) -> list[Any]:
        with self._lock:
            return list(self.lines)

    def _emit(self, line: Any) -> None:
        with self._lock:
            self.lines.append(line)
        self.on_line(line)

    def _run(self) -> None:
        from grid.testfleet.watch import follow

        try:
            asyncio.run(follow(self.state.nats_url, Path(self.state.control_home), self._emit,
                               stop=self._stop.is_set))
        except BaseException as exc:  # reported as a failed requirement, never swallowed
            self.error = exc


# --- requests -----------------------------------------------------------------------------------


def send_chat(client: httpx.Client, persona: str, model: str, prompt: str, max_tokens: int, *,
              retries: bool = True) -> Answer:
    """One chat completion as a client sends it, with bounded retries on retryable refusals."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    headers = {AFFINITY_HEADER: persona}
    started = time.monotonic()
    attempts = 0
    while True:
        attempts += 1
        try:
            resp = client.post("/v1/chat/completions", json=body, headers=headers)
        except httpx.HTTPError as exc:
            if retries and attempts < MAX_ATTEMPTS:
                time.sleep(1.0)
                continue
            return Answer(persona, model, None, None, 0, attempts, (time.monotonic() - started) * 1000,
                          reason=type(exc).__name__)
        if resp.status_code in RETRYABLE_STATUSES and retries and attempts < MAX_ATTEMPTS:
            time.sleep(_retry_wait(resp))
            continue
        return _answer(persona, model, resp, attempts, (time.monotonic() - started) * 1000)


def _retry_wait(resp: httpx.Response) -> float:
    try:
        wait = float(resp.headers.get("retry-after", "1"))
    except ValueError:
        wait = 1.0
    return max(0.2, min(MAX_RETRY_WAIT_SECONDS, wait))


def _answer(persona: str, model: str, resp: httpx.Response, attempts: int, latency_ms: float) -> Answer:
    from grid.gateway.errors import REASON_HEADER

    answer = Answer(persona, model, None, resp.headers.get("x-grid-host"), resp.status_code, attempts, latency_ms,
                    reason=resp.headers.get(REASON_HEADER))
    if resp.status_code != 200:
        try:
            err = resp.json().get("error", {})
            answer.reason = answer.reason or err.get("code")
        except (ValueError, AttributeError):
            pass
        return answer
    try:
        doc = resp.json()
    except ValueError:
        return answer
    usage = doc.get("usage") or {}
    choices = doc.get("choices") or [{}]
    content = ((choices[0] or {}).get("message") or {}).get("content") or ""
    answer.served_model = doc.get("model")
    answer.response_id = doc.get("id")
    answer.prompt_tokens = usage.get("prompt_tokens")
    answer.completion_tokens = usage.get("completion_tokens")
    answer.content_chars = len(content.strip())
    return answer


# --- the flow -----------------------------------------------------------------------------------


class Demo:
    def __init__(self, state: FleetManifest, spec: DemoSpec, *, say: Say, progress: Progress,
                 on_line: Callable[[Any], None]) -> None:
        from grid.testfleet.fleet import admin_request, gateway_headers

        self.state = state
        self.spec = spec
        self.say = say
        self.progress = progress
        self.admin = lambda method, path, body=None: admin_request(state, method, path, body)
        self.baseline = state.settings.model_id
        self.coding = self._coding_id()
        self.report = DemoReport(baseline_model=self.baseline, coding_model=self.coding)
        self.follower = Follower(state, on_line)
        self._last_seen = "the fleet was not asked"
        self.client = httpx.Client(base_url=state.gateway_url, headers=gateway_headers(), timeout=HTTP_TIMEOUT_SECONDS,
                                   trust_env=False)

    def _coding_id(self) -> str:
        if self.spec.coding_model is not None:
            return self.spec.coding_model.name
        return self.baseline.removesuffix(".gguf") + CODING_SUFFIX

    def run(self) -> DemoReport:
        self.report.started_at = time.time()
        self.follower.start()
        try:
            self._flow()
        finally:
            # Let the last heartbeats land so the lifecycles are complete up to now.
            time.sleep(1.5)
            self.follower.stop()
            self.client.close()
            self._collect()
            self.report.finished_at = time.time()
        return self.report

    def _flow(self) -> None:
        r = self.report
        self._declare_models()
        # Observed demand is retained between runs (it expires on its own, never cleared), so the
        # fleet first converges to idle: one baseline replica and no coding model.
        self.say(f"baseline {self.baseline}: converging to one ready replica and no {self.coding}")
        ready = self._wait("one baseline replica, no coding model", self._idle, self.spec.converge_timeout)
        if not r.require(REQ_BASELINE_ONE_REPLICA, ready is not None,
                         f"ready on {sorted(ready)}" if ready else
                         f"not idle within {self.spec.converge_timeout:.0f}s ({self._last_seen})"):
            return
        first = send_chat(self.client, "operator", self.baseline, GENERAL_PROMPTS[0], self.spec.max_tokens)
        r.answers.append(first)
        if not r.require(REQ_BASELINE_ANSWERS, first.ok, _describe(first)):
            return

        # Distinct users, coding requests for `auto`: refused honestly (no retries: the 503 is the point).
        users = max(3, self.spec.users)
        self.say(f"{users} users send coding requests for model auto (no ready model serves coding yet)")
        refused = []
        for i in range(users):
            a = send_chat(self.client, f"user-{i + 1}", "auto", CODING_PROMPTS[i % len(CODING_PROMPTS)],
                          self.spec.max_tokens, retries=False)
            r.answers.append(a)
            refused.append(a)
        honest = [a for a in refused if a.status == 503]
        r.require(REQ_AUTO_HONEST_503, len(honest) == len(refused),
                  f"{len(honest)} of {len(refused)} answered 503 ({sorted({str(a.reason) for a in refused})})")

        self.say(f"waiting for the allocator to load and warm {self.coding} (nothing names it)")
        warmed = self._wait(f"{self.coding} READY", lambda: self._ready_hosts(self.coding), self.spec.warm_timeout)
        named_before = [a for a in r.answers if a.model == self.coding]
        loads = [c for c in self._commands() if c["model_id"] == self.coding and c["kind"] == "load"]
        r.require(REQ_CODING_WARMED_UNNAMED, warmed is not None and not named_before and bool(loads),
                  f"ready on {sorted(warmed or [])}; load commands: "
                  + ("; ".join(f"{c['host_id']} ({c['reason']})" for c in loads) or "none"))
        if warmed is None:
            return

        named = send_chat(self.client, "user-1", self.coding, CODING_PROMPTS[0], self.spec.max_tokens)
        r.answers.append(named)
        if not r.require(REQ_CODING_ANSWERS, named.ok, _describe(named)):
            return

        self.say(f"{self.spec.users} personas send {self.spec.requests} concurrent requests to both models")
        batch = self._personas()
        r.answers.extend(batch)
        answered = [a for a in batch if a.ok]
        per_model = {m: sum(1 for a in answered if a.model == m) for m in (self.baseline, self.coding)}
        r.require(REQ_PERSONAS_ANSWERED, len(answered) == len(batch) and all(per_model.values()),
                  f"{len(answered)} of {len(batch)} answered; per model {per_model}; "
                  f"{sum(1 for a in batch if a.attempts > 1)} needed a retry")
        served = [a for a in r.answers if a.status == 200]
        r.require(REQ_ANSWERS_COMPLETE, bool(served) and all(a.ok for a in served),
                  f"{sum(1 for a in served if a.ok)} of {len(served)} answers have an id, usage and text")

    def _personas(self) -> list[Answer]:
        jobs = []
        models = (self.baseline, self.coding)
        for i in range(self.spec.requests):
            persona = f"persona-{i % self.spec.users + 1}"
            model = models[i % 2]
            prompts = CODING_PROMPTS if model == self.coding else GENERAL_PROMPTS
            jobs.append((persona, model, prompts[(i // 2) % len(prompts)]))
        with ThreadPoolExecutor(max_workers=self.spec.users) as pool:
            return list(pool.map(lambda j: send_chat(self.client, j[0], j[1], j[2], self.spec.max_tokens), jobs))

    # --- set-up and observation ---

    def _declare_models(self) -> None:
        """The baseline keeps its artifact and gains the demo's workload scores; the coding model
        is declared with no minimum, so only demand can place it."""
        from grid.localgrid import bundled_profile

        settings = self.state.settings
        base = bundled_profile(model_id=self.baseline, artifact_sha256=settings.artifact_sha256,
                               memory_mb=settings.model_memory_mb, min_replicas=1, max_replicas=settings.machines,
                               workload_scores=BASELINE_SCORES, min_residency_seconds=DEMO_MIN_RESIDENCY_SECONDS,
                               scale_down_cooldown_seconds=DEMO_COOLDOWN_SECONDS)
        sha, memory_mb = settings.artifact_sha256, settings.model_memory_mb
        if self.spec.coding_model is not None:
            sha, memory_mb = self._push(self.spec.coding_model)
        coding = bundled_profile(model_id=self.coding, artifact_sha256=sha, memory_mb=memory_mb, min_replicas=0,
                                 max_replicas=max(1, settings.machines - 1), workload_scores=CODING_SCORES,
                                 min_residency_seconds=DEMO_MIN_RESIDENCY_SECONDS,
                                 scale_down_cooldown_seconds=DEMO_COOLDOWN_SECONDS)
        for profile in (base, coding):
            body = {k: v for k, v in msgspec.to_builtins(profile).items() if k != "model_id"}
            self.admin("PUT", f"/allocator/models/{profile.model_id}", body)
        self.say(f"declared {self.baseline} (scores {BASELINE_SCORES}) and {self.coding} (scores {CODING_SCORES}, "
                 "no minimum replicas)")

    def _push(self, path: Path) -> tuple[str, int]:
        """Another GGUF: verified into the fleet's model cache and stored in the grid's artifact
        store, from where the hosts fetch it when the allocator places it."""
        from grid.testfleet.fleet import _env, _gridctl
        from grid.testfleet.sizing import prepare_model

        model = prepare_model(Path(self.state.root), path, self.say)
        self.say(f"storing {model.model_id} in the grid's artifact store")
        pushed = subprocess.run(_gridctl("model", "push", str(model.blob), "--nats", self.state.nats_url, "--json"),
                                env=_env(Path(self.state.control_home)), capture_output=True, text=True,
                                timeout=600, stdin=subprocess.DEVNULL)
        if pushed.returncode != 0:
            raise FleetError(f"gridctl model push failed: {(pushed.stderr or pushed.stdout).strip()[-400:]}")
        return model.sha256, model.memory_mb

    def _status(self) -> dict[str, Any]:
        return self.admin("GET", "/allocator/status")  # type: ignore[no-any-return]

    def _ready_hosts(self, model_id: str) -> set[str]:
        status = self._status()
        for w in status.get("forecasts", {}).get("workloads", []):
            if w.get("workload") == "coding" and w.get("model_id"):
                self.report.coding_workload = {k: w.get(k) for k in (
                    "status", "gate", "observations", "model_id", "replicas", "canary", "offered_concurrency")}
        return _hosts_in(status, model_id, {"ready"})

    def _idle(self) -> set[str] | None:
        status = self._status()
        baseline = _hosts_in(status, self.baseline, {"ready"})
        coding = _hosts_in(status, self.coding, LIVE_STATES)
        self._last_seen = (f"baseline ready on {sorted(baseline) or 'no host'}, coding model live on "
                           f"{sorted(coding) or 'no host'}")
        return baseline if len(baseline) == 1 and not coding else None

    def _wait(self, what: str, probe: Callable[[], Any], timeout: float) -> Any:
        started = time.monotonic()
        while True:
            elapsed = time.monotonic() - started
            self.progress(what, elapsed, timeout)
            try:
                value = probe()
            except (FleetError, httpx.HTTPError) as exc:
                self.say(f"{what}: {exc}")
                value = None
            if value:
                self.progress(what, timeout, timeout)
                return value
            if elapsed >= timeout:
                return None
            time.sleep(0.5)

    def _commands(self) -> list[dict[str, Any]]:
        out = []
        for line in self.follower.snapshot():
            if line.kind == "command":
                reason = line.text.split(" (", 1)[1].rstrip(")") if " (" in line.text else ""
                out.append({"at": line.at, "kind": line.after, "host_id": line.host_id, "model_id": line.model_id,
                            "reason": reason})
        return out

    def _collect_log(self) -> None:
        """Transitions, commands and the timeline from the fleet's log, and whether it was followed."""
        r = self.report
        lines = self.follower.snapshot()
        r.transitions = [ResidencyTransition(x.at, x.host_id, x.model_id, x.before, x.after) for x in lines
                         if x.kind == "residency"]
        r.commands = self._commands()
        r.timeline = [{"at": x.at, "kind": x.kind, "host_id": x.host_id, "text": x.text} for x in lines]
        if self.follower.error is not None:
            r.require("fleet_log_followed", False, f"following the fleet's log failed: {self.follower.error!r}")

    def _collect(self) -> None:
        self._collect_log()
        r = self.report
        if not any(q["name"] == REQ_CODING_ANSWERS and q["ok"] for q in r.requirements):
            return
        perf = r.performance()
        models_sampled = {m for per_host in perf.values() for m in per_host}
        r.require(REQ_PERFORMANCE_SAMPLES, {self.baseline, self.coding} <= models_sampled,
                  "; ".join(f"{h}: " + ", ".join(f"{m} {v['samples']} samples p50 {v['p50_latency_ms']} ms "
                                                   f"{v['tokens_per_second']} tok/s" for m, v in row.items())
                            for h, row in perf.items()))
        paths = {h: [t for t in r.transitions if t.model_id == self.coding and t.host_id == h]
                 for h in sorted({t.host_id for t in r.transitions if t.model_id == self.coding})}
        # A heartbeat every second may miss a sub-second state (loading), never where it started
        # and whether it became ready.
        complete = any(p[0].before == "absent" and any(t.after == "ready" for t in p) for p in paths.values())
        r.require(REQ_LIFECYCLE, complete,
                  "; ".join(f"{h}: " + " -> ".join([p[0].before, *(t.after for t in p)]) for h, p in paths.items())
                  or "no transition of the coding model seen")


def _hosts_in(status: dict[str, Any], model_id: str, states: set[str] | frozenset[str]) -> set[str]:
    """Fresh hosts whose heartbeat reports `model_id` in one of `states`."""
    return {h["host_id"] for h in status["hosts"]
            if h["fresh"] and any(x["model_id"] == model_id and x["state"] in states for x in h["residencies"])}


def _describe(a: Answer) -> str:
    if a.ok:
        return (f"{a.served_model} on {a.host_id}: id {a.response_id}, {a.prompt_tokens}+{a.completion_tokens} "
                f"tokens, {a.latency_ms:.0f} ms, {a.attempts} attempt(s)")
    return f"status {a.status} ({a.reason}) after {a.attempts} attempt(s)"


def run_demo(state: FleetManifest, spec: DemoSpec, *, say: Say = lambda _: None,
             progress: Progress = lambda *_: None, on_line: Callable[[Any], None] = lambda _: None) -> DemoReport:
    if spec.users < 1 or spec.requests < 2 or spec.max_tokens < 1:
        raise FleetError("--users must be >= 1, --requests >= 2 (both models) and --max-tokens >= 1")
    if not state.ready:
        raise FleetError("the test fleet is not ready (`gridctl test start` waits until it is)")
    if spec.coding_model is not None and spec.coding_model.name == state.settings.model_id:
        raise FleetError(f"--model {spec.coding_model.name} is the fleet's baseline model; name another GGUF "
                         "for the coding model, or leave --model out to use a second profile of the baseline")
    return Demo(state, spec, say=say, progress=progress, on_line=on_line).run()
