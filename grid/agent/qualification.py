"""Runtime qualification: a runtime's real lifecycle for one model, run on this host.

Before a host is trusted with a runtime (a newly installed engine, a new model), it runs the
lifecycle the agent would run, step by step, against the real engine:

- llama.cpp (the runtime the agent spawns, grid.agent.engines): inventory (the runtime and the
  artifact are here), identity (the artifact's sha256 is the expected immutable digest), warm
  (the engine starts and loads the weights), ownership (the process is provably the one started
  here), readiness (the engine's native API lists the model and refuses requests without its
  key), inference (a real completion), activity (an in-flight request shows on the engine's
  slots), drain (activity returns to zero once it completes) and stop (the proven process is
  gone and its port free);
- an external engine (one Grid did not start and never will): reachability, identity (the
  endpoint lists the model) and inference. It is never stopped or signalled.

Every step ends in a value: passed, or failed with a reason constant and a detail for people.
The first failure ends the run (the steps after it did not run). The outcome becomes durable
evidence as a signed `QualificationRecorded` on the log (grid.cli.qualify writes it): names,
digests and reason constants only; the fixed prompt and the engine's answers never leave here.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from grid.agent import external
from grid.agent.artifacts import ArtifactCache, hash_file
from grid.agent.engines import llama_cpp
from grid.agent.engines.runtime import Runtime, RuntimeChoiceError, describe, find_runtime
from grid.agent.state import ProcessProof
from grid.events.base import new_event_id
from grid.events.host import QUALIFICATION_FAILED, QUALIFICATION_PASSED, QualificationRecorded, QualificationStep
from grid.secrets import ensure_private_dir, write_owner_only

RUNTIME_LLAMA_CPP = llama_cpp.RUNTIME
# The runtime name an external engine's qualification is recorded under.
RUNTIME_EXTERNAL = "external"

# --- steps --------------------------------------------------------------------------------------
STEP_INVENTORY = "inventory"
STEP_IDENTITY = "identity"
STEP_WARM = "warm"
STEP_OWNERSHIP = "ownership"
STEP_READINESS = "readiness"
STEP_INFERENCE = "inference"
STEP_ACTIVITY = "activity"
STEP_DRAIN = "drain"
STEP_STOP = "stop"
STEP_REACHABILITY = "reachability"

LLAMA_CPP_STEPS: tuple[str, ...] = (STEP_INVENTORY, STEP_IDENTITY, STEP_WARM, STEP_OWNERSHIP, STEP_READINESS,
                                    STEP_INFERENCE, STEP_ACTIVITY, STEP_DRAIN, STEP_STOP)
EXTERNAL_STEPS: tuple[str, ...] = (STEP_REACHABILITY, STEP_IDENTITY, STEP_INFERENCE)

# --- reasons a step fails -------------------------------------------------------------------------
RUNTIME_UNAVAILABLE = "runtime_unavailable"
ARTIFACT_NOT_FOUND = "artifact_not_found"
DIGEST_UNKNOWN = "digest_unknown"
DIGEST_MISMATCH = "digest_mismatch"
NO_FREE_PORT = "no_free_port"
ENGINE_EXITED = "engine_exited"
WARM_TIMEOUT = "warm_timeout"
OWNERSHIP_UNPROVEN = "ownership_unproven"
MODEL_NOT_LISTED = "model_not_listed"
KEY_NOT_ENFORCED = "key_not_enforced"
INFERENCE_FAILED = "inference_failed"
ACTIVITY_UNOBSERVED = "activity_unobserved"
DRAIN_TIMEOUT = "drain_timeout"
STOP_FAILED = "stop_failed"
UNREACHABLE = "unreachable"
KEY_REFUSED = "api_key_refused"
KEY_UNREADABLE = "api_key_file_unreadable"
BAD_ENDPOINT = "bad_endpoint"

# The one prompt a qualification sends: fixed, harmless, long enough to keep a slot busy while
# the activity step looks. Neither it nor any answer is ever logged or recorded.
PROMPT = "Count from 1 to 200, separated by commas."
INFERENCE_MAX_TOKENS = 8
ACTIVITY_MAX_TOKENS = 64


@dataclass(frozen=True)
class Check:
    """A step's verdict: passed, or failed for `reason` (a constant above)."""

    ok: bool
    reason: str = ""
    detail: str = ""


PASS = Check(True)


def failed(reason: str, detail: str = "") -> Check:
    return Check(False, reason, detail)


@dataclass(frozen=True)
class StepResult:
    name: str
    ok: bool
    seconds: float
    reason: str = ""
    detail: str = ""


@dataclass(frozen=True)
class Qualification:
    """The outcome of one qualification run."""

    runtime: str
    model_id: str
    steps: tuple[StepResult, ...]
    planned: tuple[str, ...]
    artifact_sha256: str | None = None
    endpoint: str | None = None

    @property
    def passed(self) -> bool:
        return len(self.steps) == len(self.planned) and all(s.ok for s in self.steps)

    @property
    def failure(self) -> StepResult | None:
        return next((s for s in self.steps if not s.ok), None)

    def event(self, host_id: str, now: float) -> QualificationRecorded:
        """The durable evidence: names, digests, reason constants and durations only."""
        failure = self.failure
        return QualificationRecorded(
            event_id=new_event_id(), at=now, host_id=host_id, runtime=self.runtime, model_id=self.model_id,
            artifact_sha256=self.artifact_sha256, result=QUALIFICATION_PASSED if self.passed else QUALIFICATION_FAILED,
            failed_step=failure.name if failure is not None else None,
            reason=failure.reason if failure is not None else "",
            steps=tuple(QualificationStep(name=s.name, ok=s.ok, seconds=s.seconds, reason=s.reason) for s in self.steps),
            endpoint=self.endpoint,
        )


class Observer:
    """What a display (or a test) sees of a run: each step as it starts and as it ends."""

    def started(self, name: str) -> None:
        pass

    def finished(self, result: StepResult) -> None:
        pass


async def run_steps(steps: Sequence[tuple[str, Callable[[], Awaitable[Check]]]],
                    observer: Observer) -> tuple[StepResult, ...]:
    """Run the steps in order until one fails."""
    done: list[StepResult] = []
    for name, step in steps:
        observer.started(name)
        began = time.monotonic()
        check = await step()
        result = StepResult(name, check.ok, round(time.monotonic() - began, 3), check.reason, check.detail)
        done.append(result)
        observer.finished(result)
        if not check.ok:
            break
    return tuple(done)


def _auth(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def _chat_body(model_id: str, max_tokens: int, *, stream: bool = False) -> dict[str, object]:
    return {"model": model_id, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens,
            "temperature": 0, "stream": stream}


async def _completion(http: httpx.AsyncClient, endpoint: str, key: str | None, model_id: str,
                      timeout: float) -> Check:
    """One real chat completion: an answer with content and at least one generated token."""
    try:
        resp = await http.post(f"{endpoint}/v1/chat/completions", headers=_auth(key),
                               json=_chat_body(model_id, INFERENCE_MAX_TOKENS), timeout=timeout)
    except httpx.HTTPError as exc:
        return failed(INFERENCE_FAILED, f"no answer: {type(exc).__name__}")
    if resp.status_code in (401, 403):
        return failed(KEY_REFUSED, f"/v1/chat/completions answered {resp.status_code}: the API key was refused")
    if resp.status_code != 200:
        return failed(INFERENCE_FAILED, f"/v1/chat/completions answered {resp.status_code}")
    try:
        doc = resp.json()
        content = doc["choices"][0]["message"]["content"]
        tokens = int((doc.get("usage") or {}).get("completion_tokens", 0))
    except (ValueError, KeyError, IndexError, TypeError):
        return failed(INFERENCE_FAILED, "the answer is not an OpenAI chat completion")
    if not isinstance(content, str) or tokens < 1:
        return failed(INFERENCE_FAILED, "the completion generated no tokens")
    return Check(True, detail=f"{tokens} tokens")


# --- llama.cpp --------------------------------------------------------------------------------------


@dataclass
class LlamaCppOptions:
    model: str  # a model id in this host's artifact cache, or a path to a GGUF file
    artifacts_dir: Path
    # Where the engine's key file and log live while it runs (made private, removed after).
    work_dir: Path
    # The digest the artifact must have (--digest, else the model's profile); None: the
    # digest this host's artifact cache verified it under.
    expected_sha256: str | None = None
    runtime_binary: str | None = None
    port_range: tuple[int, int] = (38000, 38999)
    threads: int = field(default_factory=llama_cpp.default_threads)
    ready_timeout: float = 120.0
    request_timeout: float = 60.0
    drain_timeout: float = 30.0
    stop_term_timeout: float = 10.0
    stop_kill_timeout: float = 5.0
    context_size: int = 512


@dataclass
class _Engine:
    """The engine this run started (and only it is ever signalled)."""

    popen: subprocess.Popen[bytes] | None = None
    proof: ProcessProof | None = None
    port: int = 0
    key: str = ""
    key_dir: Path | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


class LlamaCppQualification:
    """One qualification of llama.cpp for one model (run it once)."""

    def __init__(self, options: LlamaCppOptions) -> None:
        self.options = options
        self.model_id = options.model
        self.runtime: Runtime | None = None
        self.model_path: Path | None = None
        self.cached_sha256: str | None = None
        self.sha256: str | None = None
        self.engine = _Engine()
        self._stream: asyncio.Task[Check] | None = None

    @property
    def engine_pid(self) -> int | None:
        return self.engine.popen.pid if self.engine.popen is not None else None

    async def run(self, observer: Observer | None = None) -> Qualification:
        async with httpx.AsyncClient(trust_env=False) as http:
            self.http = http
            try:
                steps = await run_steps(((STEP_INVENTORY, self.inventory), (STEP_IDENTITY, self.identity),
                                         (STEP_WARM, self.warm), (STEP_OWNERSHIP, self.ownership),
                                         (STEP_READINESS, self.readiness), (STEP_INFERENCE, self.inference),
                                         (STEP_ACTIVITY, self.activity), (STEP_DRAIN, self.drain),
                                         (STEP_STOP, self.stop)), observer or Observer())
            finally:
                await self._cleanup()
        return Qualification(RUNTIME_LLAMA_CPP, self.model_id, steps, LLAMA_CPP_STEPS, artifact_sha256=self.sha256)

    # -- steps --

    async def inventory(self) -> Check:
        try:
            self.runtime = find_runtime(self.options.runtime_binary)
        except RuntimeChoiceError as exc:
            return failed(RUNTIME_UNAVAILABLE, str(exc))
        if self.runtime is None:
            return failed(RUNTIME_UNAVAILABLE, "no llama.cpp server here (pip install xllamacpp, or --runtime-binary)")
        path = Path(self.options.model).expanduser()
        if path.is_file():
            self.model_path, self.model_id = path.resolve(), path.name
        else:
            cache = ArtifactCache(self.options.artifacts_dir)
            entry = cache.lookup(self.options.model)
            if entry is None or not cache.blob_path(entry.sha256).is_file():
                return failed(ARTIFACT_NOT_FOUND, f"{self.options.model!r} is neither a file nor in this host's "
                                                  f"artifact cache (gridctl pull)")
            self.model_path, self.cached_sha256 = cache.blob_path(entry.sha256), entry.sha256
        size_mb = self.model_path.stat().st_size / (1 << 20)
        return Check(True, detail=f"{describe(self.runtime)}; {self.model_path.name} ({size_mb:.0f} MiB)")

    async def identity(self) -> Check:
        assert self.model_path is not None
        expected = self.options.expected_sha256 or self.cached_sha256
        self.sha256, _ = await asyncio.to_thread(hash_file, self.model_path)
        if expected is None:
            return failed(DIGEST_UNKNOWN, "no expected digest: pass --digest or set the model's profile "
                                          "artifact_sha256")
        if self.sha256 != expected.lower():
            return failed(DIGEST_MISMATCH, f"the artifact is sha256 {self.sha256}, expected {expected.lower()}")
        return Check(True, detail=f"sha256 {self.sha256}")

    async def warm(self) -> Check:
        assert self.runtime is not None and self.model_path is not None
        o, engine = self.options, self.engine
        port = next((p for p in range(o.port_range[0], o.port_range[1] + 1) if llama_cpp.port_free(p)), None)
        if port is None:
            return failed(NO_FREE_PORT, f"no free port in {o.port_range[0]}-{o.port_range[1]}")
        engine.port, engine.key = port, secrets.token_urlsafe(32)
        engine.key_dir = Path(tempfile.mkdtemp(prefix="qualify-", dir=ensure_private_dir(o.work_dir)))
        key_file = engine.key_dir / "engine.key"
        write_owner_only(key_file, engine.key.encode())
        spec = llama_cpp.EngineSpec(model_id=self.model_id, model_path=self.model_path, port=port, key_file=key_file,
                                    context_size=o.context_size, threads=o.threads)
        engine.popen = llama_cpp.spawn(self.runtime.command, spec, engine.key_dir / "engine.log")
        ready = await llama_cpp.wait_ready(self.http, engine.endpoint, engine.key, timeout=o.ready_timeout,
                                           alive=engine.alive)
        if not engine.alive():
            return failed(ENGINE_EXITED, f"the engine exited with {engine.popen.returncode} while loading")
        if not ready:
            return failed(WARM_TIMEOUT, f"not healthy within {o.ready_timeout:g}s")
        return Check(True, detail=f"pid {engine.popen.pid}, port {port}")

    async def ownership(self) -> Check:
        engine = self.engine
        if not engine.alive():
            return self._exited()
        assert engine.popen is not None
        try:
            engine.proof = llama_cpp.capture_proof(engine.popen.pid, engine.port)
            parent = psutil.Process(engine.popen.pid).ppid()
        except (psutil.Error, OSError) as exc:
            return failed(OWNERSHIP_UNPROVEN, f"cannot inspect pid {engine.popen.pid}: {type(exc).__name__}")
        argv = engine.proof.cmdline or ()
        if llama_cpp.prove(engine.proof) != llama_cpp.PROOF_MATCH or parent != os.getpid():
            return failed(OWNERSHIP_UNPROVEN, f"pid {engine.popen.pid} is not provably the engine started here")
        if not _flag_is(argv, "--port", str(engine.port)) or not _flag_is(argv, "--alias", self.model_id):
            return failed(OWNERSHIP_UNPROVEN, "the process's command line is not the one started here")
        return Check(True, detail=f"pid {engine.popen.pid} (exe, command line, start time)")

    async def readiness(self) -> Check:
        engine = self.engine
        try:
            listed = await self.http.get(f"{engine.endpoint}/v1/models", headers=_auth(engine.key), timeout=5.0)
            keyless = await self.http.post(f"{engine.endpoint}/v1/chat/completions",
                                           json=_chat_body(self.model_id, 1), timeout=5.0)
        except httpx.HTTPError as exc:
            return await self._gone_or(failed(MODEL_NOT_LISTED, f"no answer: {type(exc).__name__}"))
        models = external.listed_models(listed.content) if listed.status_code == 200 else None
        if models is None or self.model_id not in models:
            return failed(MODEL_NOT_LISTED, f"/v1/models answered {listed.status_code} without {self.model_id!r}")
        if keyless.status_code not in (401, 403):
            return failed(KEY_NOT_ENFORCED, f"a request without the engine key was answered {keyless.status_code}")
        return Check(True, detail="model listed; requests without the key refused")

    async def inference(self) -> Check:
        engine = self.engine
        if not engine.alive():
            return self._exited()
        check = await _completion(self.http, engine.endpoint, engine.key, self.model_id, self.options.request_timeout)
        return check if check.ok else await self._gone_or(check)

    async def activity(self) -> Check:
        """A streamed request in flight must show as a busy slot (the agent drains by it)."""
        engine = self.engine
        first = asyncio.get_running_loop().create_future()
        stream = self._stream = asyncio.create_task(self._stream_request(first))
        try:
            await asyncio.wait_for(asyncio.shield(first), timeout=self.options.request_timeout)
        except asyncio.TimeoutError:
            pass
        if not first.done() or not first.result():
            return await self._gone_or(failed(ACTIVITY_UNOBSERVED, "the streamed request produced no token"))
        # Looked at until the request completes: a busy slot must show while it streams.
        while True:
            active = await llama_cpp.probe_active(self.http, engine.endpoint, engine.key)
            if active is None:
                return await self._gone_or(failed(ACTIVITY_UNOBSERVED, "/slots did not report activity"))
            if active >= 1:
                return Check(True, detail=f"{active} busy slot(s) while a request streamed")
            if stream.done():
                return failed(ACTIVITY_UNOBSERVED, "a request streamed to its end without a busy slot showing")
            await asyncio.sleep(0.01)

    async def drain(self) -> Check:
        """The in-flight request completes and activity returns to zero."""
        engine, deadline = self.engine, time.monotonic() + self.options.drain_timeout
        stream = self._stream
        if stream is not None:
            try:
                streamed = await asyncio.wait_for(stream, timeout=self.options.drain_timeout)
            except asyncio.TimeoutError:
                return failed(DRAIN_TIMEOUT, f"the request in flight did not complete within "
                                             f"{self.options.drain_timeout:g}s")
            if not streamed.ok:
                return await self._gone_or(streamed)
        while time.monotonic() < deadline:
            if not engine.alive():
                return self._exited()
            if await llama_cpp.probe_active(self.http, engine.endpoint, engine.key) == 0:
                return Check(True, detail="no request in flight")
            await asyncio.sleep(0.05)
        return failed(DRAIN_TIMEOUT, f"slots still busy after {self.options.drain_timeout:g}s")

    async def stop(self) -> Check:
        engine, o = self.engine, self.options
        if engine.proof is None or engine.popen is None:
            return failed(STOP_FAILED, "no proven engine to stop")
        outcome = await asyncio.to_thread(llama_cpp.stop_process, engine.proof, term_timeout=o.stop_term_timeout,
                                          kill_timeout=o.stop_kill_timeout, popen=engine.popen)
        if outcome != llama_cpp.STOP_STOPPED:
            return failed(STOP_FAILED, f"stop ended {outcome}")
        if not llama_cpp.port_free(engine.port):
            return failed(STOP_FAILED, f"port {engine.port} is still taken after the stop")
        return Check(True, detail="stopped on SIGTERM, port free")

    # -- helpers --

    async def _stream_request(self, first: asyncio.Future[bool]) -> Check:
        engine = self.engine
        chunks = 0
        try:
            async with self.http.stream("POST", f"{engine.endpoint}/v1/chat/completions", headers=_auth(engine.key),
                                        json=_chat_body(self.model_id, ACTIVITY_MAX_TOKENS, stream=True),
                                        timeout=self.options.request_timeout) as resp:
                if resp.status_code != 200:
                    raise httpx.HTTPStatusError("refused", request=resp.request, response=resp)
                async for line in resp.aiter_lines():
                    if line.startswith("data:") and line.strip() != "data: [DONE]":
                        chunks += 1
                        if not first.done():
                            first.set_result(True)
        except httpx.HTTPError as exc:
            if not first.done():
                first.set_result(False)
            return failed(INFERENCE_FAILED, f"the streamed request failed: {type(exc).__name__}")
        if not first.done():
            first.set_result(False)
        return Check(chunks > 0, "" if chunks else INFERENCE_FAILED)

    def _exited(self) -> Check:
        code = self.engine.popen.returncode if self.engine.popen is not None else None
        return failed(ENGINE_EXITED, f"the engine is gone (exit {code})")

    async def _gone_or(self, check: Check) -> Check:
        """`check`, unless the engine died: then that is the reason (a failed request is its symptom)."""
        popen = self.engine.popen
        if popen is None:
            return check
        try:
            await asyncio.to_thread(popen.wait, 1.0)
        except subprocess.TimeoutExpired:
            return check
        return self._exited()

    async def _cleanup(self) -> None:
        """Whatever failed, the engine this run started does not outlive it."""
        engine = self.engine
        if self._stream is not None and not self._stream.done():
            self._stream.cancel()
            await asyncio.gather(self._stream, return_exceptions=True)
        if engine.popen is not None and engine.popen.poll() is None:
            if engine.proof is not None:
                await asyncio.to_thread(llama_cpp.stop_process, engine.proof, term_timeout=self.options.stop_term_timeout,
                                        kill_timeout=self.options.stop_kill_timeout, popen=engine.popen)
            else:  # our own child, not yet proven: only it can hold this Popen
                engine.popen.kill()
                await asyncio.to_thread(engine.popen.wait)
        if engine.key_dir is not None:
            shutil.rmtree(engine.key_dir, ignore_errors=True)


def _flag_is(argv: Sequence[str], flag: str, value: str) -> bool:
    return any(a == flag and i + 1 < len(argv) and argv[i + 1] == value for i, a in enumerate(argv))


# --- external engines ------------------------------------------------------------------------------


@dataclass
class ExternalOptions:
    url: str
    model: str
    api_key_file: Path | None = None
    request_timeout: float = 60.0
    kind: str = external.KIND_OPENAI


@dataclass
class ExternalQualification:
    """Reachability, identity and inference of an engine Grid did not start. Nothing here
    starts, stops or signals a process: only HTTP requests reach the endpoint."""

    options: ExternalOptions
    endpoint: str | None = None
    key: str | None = None
    models: tuple[str, ...] = field(default_factory=tuple)

    async def run(self, observer: Observer | None = None) -> Qualification:
        async with httpx.AsyncClient(trust_env=False) as http:
            self.http = http
            steps = await run_steps(((STEP_REACHABILITY, self.reachability), (STEP_IDENTITY, self.identity),
                                     (STEP_INFERENCE, self.inference)), observer or Observer())
        return Qualification(RUNTIME_EXTERNAL, self.options.model, steps, EXTERNAL_STEPS, endpoint=self.endpoint)

    async def reachability(self) -> Check:
        o = self.options
        reg = external.validate(o.model, o.url, o.kind, 0, o.api_key_file)
        if isinstance(reg, external.RegistrationRefused):
            return failed(BAD_ENDPOINT, reg.message)
        self.endpoint = reg.url
        self.key, unreadable = external.read_key(reg)
        if unreadable is not None:
            return failed(KEY_UNREADABLE, unreadable.detail)
        try:
            resp = await self.http.get(reg.url + external.MODELS_PATH, headers=_auth(self.key), timeout=10.0)
        except httpx.HTTPError as exc:
            return failed(UNREACHABLE, f"{reg.url} did not answer: {type(exc).__name__}")
        if resp.status_code in (401, 403):
            return failed(KEY_REFUSED, f"{external.MODELS_PATH} answered {resp.status_code}: the API key was refused")
        models = external.listed_models(resp.content) if resp.status_code == 200 else None
        if models is None:
            return failed(UNREACHABLE, f"{external.MODELS_PATH} answered {resp.status_code}, not an OpenAI model list")
        self.models = models
        return Check(True, detail=f"{reg.url} lists {len(models)} model(s)")

    async def identity(self) -> Check:
        if self.options.model not in self.models:
            shown = ", ".join(self.models[:8]) or "none"
            return failed(MODEL_NOT_LISTED, f"the endpoint does not list {self.options.model!r} (it lists: {shown})")
        return Check(True, detail=f"{self.options.model} listed")

    async def inference(self) -> Check:
        assert self.endpoint is not None
        return await _completion(self.http, self.endpoint, self.key, self.options.model, self.options.request_timeout)
