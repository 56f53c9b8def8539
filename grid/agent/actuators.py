"""The actuators (load, warm, drain, unload, evict) and the graceful drain of every child at stop.

Each actuator runs inside the agent's single worker, after fencing admitted its command; it
persists every state change before the next side effect and returns an Outcome (never raises
for an expected failure). A child is only ever signalled through llama_cpp.stop_process, which
re-proves ownership right before each signal.

A load whose reason is PREDICTIVE_PREFETCH is a cache-only advisory: it fetches and verifies like
any load and leaves the artifact cached, and when it really downloaded the blob (it was not on
disk before) the cache index marks the entry predictive. A real load or a warm of the model marks
it used for good. evict deletes only such an unused predictive download (grid.agent.eviction).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from pathlib import Path

import psutil
import structlog
from prometheus_client import Histogram

from grid.agent import eviction
from grid.agent.accelerators import DISCRETE_BACKENDS, choose_devices, llama_device_name
from grid.agent.artifacts import IndexEntry, SourceError, normalize_sha256
from grid.agent.context import MIB, AgentContext, endpoint
from grid.agent.engines import llama_cpp
from grid.agent.outcomes import (
    MSG_ACTIVITY_UNKNOWN,
    MSG_ALREADY_ABSENT,
    MSG_ALREADY_READY,
    MSG_DRAIN_DEADLINE,
    MSG_DRAINED,
    MSG_ENGINE_EXITED,
    MSG_EVICT_FAILED,
    MSG_EVICTED,
    MSG_FENCED,
    MSG_INSUFFICIENT_MEMORY,
    MSG_NO_FREE_PORT,
    MSG_NOT_DRAINED,
    MSG_PERSIST_FAILED,
    MSG_READINESS_TIMEOUT,
    MSG_READY,
    MSG_REQUESTS_IN_FLIGHT,
    MSG_RESIDENCY_BUSY,
    MSG_RUNTIME_UNAVAILABLE,
    MSG_SPAWN_FAILED,
    MSG_STOP_TIMED_OUT,
    MSG_UNLOADED,
    NOTE_EXITED,
    NOTE_FENCED,
    Outcome,
)
from grid.agent.state import ProcessProof, ResidencyRecord
from grid.events.commands import PREDICTIVE_PREFETCH, CommandIssued
from grid.events.host import AcceleratorDevice
from grid.events.subjects import escape_token
from grid.fleet import HOLDS_MEMORY_STATES, SERVING_STATES

log = structlog.get_logger("grid.agent")


# One /slots reading of a draining engine, and how long a drain goes without any reading before it
# reports the engine's activity unknown (a failure the controller retries with backoff).
ACTIVITY_PROBE_TIMEOUT = 2.0
ACTIVITY_UNKNOWN_SECONDS = 10.0


class Actuators:
    def __init__(self, ctx: AgentContext, durations: Histogram | None = None) -> None:
        self.ctx = ctx
        # grid_agent_action_seconds{kind, status}: how long each side effect took
        self.durations = durations

    async def run(self, cmd: CommandIssued) -> Outcome:
        handler = {"load": self.load, "warm": self.warm, "drain": self.drain, "unload": self.unload,
                   "evict": self.evict}[cmd.kind]
        started = time.monotonic()
        outcome = await handler(cmd)
        if self.durations is not None:
            self.durations.labels(cmd.kind, outcome.status).observe(time.monotonic() - started)
        return outcome

    # ------------------------------------------------------------------ load
    async def load(self, cmd: CommandIssued) -> Outcome:
        ctx = self.ctx
        rec = ctx.state.residencies.get(cmd.model_id)
        created = rec is None
        if rec is None:
            rec = ResidencyRecord(model_id=cmd.model_id, state="loading", memory_mb=cmd.memory_mb,
                                  action_id=cmd.action_id)
            ctx.state.residencies[cmd.model_id] = rec
        elif rec.state == "cached":
            rec.state = "loading"
        ctx.save()
        ctx.poke()
        had_blob = await asyncio.to_thread(self._blob_present, cmd)
        outcome = await ctx.cache.ensure_artifact(
            cmd.model_id, sha256=cmd.artifact_sha256, source=cmd.artifact_source, size_mb=cmd.artifact_size_mb
        )
        if outcome.ok and outcome.sha256 is not None:
            if cmd.reason != PREDICTIVE_PREFETCH:
                # Real demand placed it here: whatever brought the blob, it is in use now.
                await asyncio.to_thread(ctx.cache.set_predictive, cmd.model_id, outcome.sha256, False)
            elif outcome.fetched and not had_blob:
                # Only what this prefetch really downloaded is its to take back.
                await asyncio.to_thread(ctx.cache.set_predictive, cmd.model_id, outcome.sha256, True)
        if outcome.ok:
            if rec.state == "loading":
                rec.state = "cached"
            rec.artifact_sha256 = outcome.sha256
            rec.model_path = outcome.path
            rec.memory_mb = cmd.memory_mb or rec.memory_mb
        elif created:
            ctx.state.residencies.pop(cmd.model_id, None)
        elif rec.state == "loading":
            rec.state = "cached"
            if not (rec.artifact_sha256 and ctx.cache.has_blob(rec.artifact_sha256)):
                ctx.state.residencies.pop(cmd.model_id, None)
        ctx.save()
        ctx.poke()
        if outcome.ok:
            return Outcome("succeeded", outcome.reason, fetched=outcome.fetched)
        return Outcome("failed", outcome.message)

    def _blob_present(self, cmd: CommandIssued) -> bool:
        """Whether the blob this load asks for is already on disk (a prefetch that finds it did
        not download it). An unreadable digest counts as present: nothing gets marked."""
        try:
            digest = normalize_sha256(cmd.artifact_sha256)
        except SourceError:
            return True
        if digest is None:
            entry: IndexEntry | None = self.ctx.cache.lookup(cmd.model_id)
            return entry is None or self.ctx.cache.has_blob(entry.sha256)
        return self.ctx.cache.has_blob(digest)

    # ------------------------------------------------------------------ warm
    def allocate_port(self) -> int | None:
        residencies = self.ctx.state.residencies.values()
        lo, hi = self.ctx.options.port_range
        taken = {r.port for r in residencies if r.port is not None}
        taken |= {r.process.port for r in residencies if r.process is not None}
        for port in range(lo, hi + 1):
            if port not in taken and llama_cpp.port_free(port):
                return port
        return None

    def memory_admits(self, memory_mb: int) -> tuple[bool, str]:
        ctx = self.ctx
        vm = psutil.virtual_memory()
        available = int(vm.available // MIB)
        if available < memory_mb:
            return False, f"{available} MiB available < {memory_mb} MiB"
        usable = ctx.capacity_mb() - ctx.options.reserved_mb
        if ctx.protection_state() == "throttled":
            usable = int(usable * ctx.options.policy.throttle_fraction)
        committed = sum(
            r.memory_mb for r in ctx.state.residencies.values() if r.state in HOLDS_MEMORY_STATES and r.process is not None
        )
        if committed + memory_mb > usable:
            return False, f"{committed}+{memory_mb} MiB > usable {usable} MiB"
        return True, ""

    async def warm(self, cmd: CommandIssued) -> Outcome:
        ctx = self.ctx
        rec = ctx.state.residencies.get(cmd.model_id)
        if rec is not None and rec.process is not None:
            if rec.state == "ready":
                verdict = await asyncio.to_thread(llama_cpp.prove, rec.process)
                if verdict == llama_cpp.PROOF_MATCH:
                    return Outcome("succeeded", MSG_ALREADY_READY)
                if verdict == llama_cpp.PROOF_GONE:
                    ctx.release(rec, NOTE_EXITED)
                else:
                    return Outcome("failed", f"{MSG_FENCED}: pid {rec.process.pid}")
            elif rec.state == "failed" and rec.note == NOTE_FENCED:
                return Outcome("failed", f"{MSG_FENCED}: a fenced process may still hold this model")
            elif rec.state != "cached":
                return Outcome("failed", f"{MSG_RESIDENCY_BUSY}: {rec.state}")
        if ctx.binary is None:
            return Outcome("failed", MSG_RUNTIME_UNAVAILABLE)
        artifact = await asyncio.to_thread(ctx.cache.verify_cached, cmd.model_id, cmd.artifact_sha256)
        if not artifact.ok:
            return Outcome("failed", artifact.message)
        if artifact.sha256 is not None:
            # Warming uses the download: from here on it is never a predictive cache entry again.
            await asyncio.to_thread(ctx.cache.set_predictive, cmd.model_id, artifact.sha256, False)
        chosen: tuple[AcceleratorDevice, ...] = ()
        if ctx.engine_backend in DISCRETE_BACKENDS:
            # A discrete GPU holds the weights: its free memory decides, not RAM.
            picked = choose_devices(ctx.devices(), ctx.engine_backend, cmd.memory_mb)
            if picked is None:
                return Outcome("failed", f"{MSG_INSUFFICIENT_MEMORY}: no {ctx.engine_backend} device has "
                                         f"{cmd.memory_mb} MiB free")
            chosen = picked
        else:
            admits, why = self.memory_admits(cmd.memory_mb)
            if not admits:
                return Outcome("failed", f"{MSG_INSUFFICIENT_MEMORY}: {why}")
        port = self.allocate_port()
        if port is None:
            return Outcome("failed", MSG_NO_FREE_PORT)
        assert artifact.path is not None
        spec = llama_cpp.EngineSpec(
            model_id=cmd.model_id, model_path=Path(artifact.path), port=port, key_file=ctx.paths.engine_key,
            slots=max(1, cmd.slots), context_size=cmd.context_size, threads=ctx.options.threads,
            embeddings=cmd.embeddings, backend=ctx.engine_backend,
            devices=tuple(llama_device_name(d) for d in chosen),
        )
        argv = tuple(llama_cpp.build_argv(ctx.binary, spec))
        if rec is None:
            rec = ResidencyRecord(model_id=cmd.model_id, state="warming")
            ctx.state.residencies[cmd.model_id] = rec
        rec.state = "warming"
        rec.memory_mb = cmd.memory_mb
        rec.artifact_sha256 = artifact.sha256
        rec.model_path = artifact.path
        rec.port = port
        rec.slots = spec.slots
        rec.context_size = cmd.context_size
        rec.action_id = cmd.action_id
        rec.note = ""
        rec.spawn_argv = argv
        rec.devices = tuple(d.index for d in chosen)
        rec.spawn_started_at = ctx.clock.now()
        rec.loaded_at = None
        ctx.save()
        ctx.poke()
        log_path = ctx.paths.logs / f"{escape_token(cmd.model_id)}-{port}.log"
        await ctx.guard_engines()  # before the spawn: no moment with an engine nobody would stop
        try:
            popen = await asyncio.to_thread(
                llama_cpp.spawn, ctx.binary, spec, log_path, ctx.owner.environ(cmd.memory_mb)
            )
        except OSError as exc:
            ctx.release(rec, MSG_SPAWN_FAILED)
            ctx.save()
            return Outcome("failed", f"{MSG_SPAWN_FAILED}: {exc.strerror}")
        ctx.popens[cmd.model_id] = popen
        # Persist PID and port in the immediate post-spawn step, then the birth proof.
        try:
            rec.process = ProcessProof(pid=popen.pid, port=port)
            ctx.save()
            rec.process = await asyncio.to_thread(llama_cpp.capture_proof, popen.pid, port)
            ctx.save()
        except Exception as exc:
            await asyncio.to_thread(kill_popen, popen)
            ctx.release(rec, MSG_PERSIST_FAILED)
            with contextlib.suppress(Exception):
                ctx.save()
            return Outcome("failed", f"{MSG_PERSIST_FAILED}: {type(exc).__name__}")
        ready = await llama_cpp.wait_ready(
            ctx.http, spec.endpoint, ctx.key, timeout=ctx.options.ready_timeout,
            alive=lambda: popen.poll() is None,
        )
        if ready:
            rec.state = "ready"
            rec.loaded_at = ctx.clock.now()
            rec.last_used_at = None
            ctx.save()
            await ctx.heartbeat_now()
            return Outcome("succeeded", MSG_READY)
        exit_code = popen.poll()
        proof = rec.process
        await asyncio.to_thread(
            llama_cpp.stop_process, proof, term_timeout=ctx.options.stop_term_timeout,
            kill_timeout=ctx.options.stop_kill_timeout, popen=popen,
        )
        still = await asyncio.to_thread(llama_cpp.prove, proof)
        if still == llama_cpp.PROOF_GONE:
            ctx.release(rec, MSG_ENGINE_EXITED if exit_code is not None else MSG_READINESS_TIMEOUT)
        else:
            rec.state = "failed"
            rec.note = "warm failed and the child could not be stopped"
        ctx.save()
        ctx.poke()
        if exit_code is not None:
            return Outcome("failed", f"{MSG_ENGINE_EXITED}: exit code {exit_code}")
        return Outcome("failed", f"{MSG_READINESS_TIMEOUT}: {ctx.options.ready_timeout:.0f}s")

    # ------------------------------------------------------------------ drain
    async def wait_idle(self, rec: ResidencyRecord, deadline_mono: float) -> Outcome:
        """Poll authenticated /slots until no work (two consecutive idle readings). An engine
        busy generating on a loaded machine can miss a probe or two: activity is only called
        unknown after ACTIVITY_UNKNOWN_SECONDS without one reading (never taken as idle)."""
        ctx = self.ctx
        idle_streak = 0
        unknown_since: float | None = None
        while True:
            active = await llama_cpp.probe_active(ctx.http, endpoint(rec), ctx.key, timeout=ACTIVITY_PROBE_TIMEOUT)
            if active is None:
                idle_streak = 0
                if unknown_since is None:
                    unknown_since = ctx.clock.monotonic()
                elif ctx.clock.monotonic() - unknown_since >= ACTIVITY_UNKNOWN_SECONDS:
                    return Outcome("failed", MSG_ACTIVITY_UNKNOWN)
            elif active == 0:
                unknown_since = None
                idle_streak += 1
                if idle_streak >= 2:
                    return Outcome("succeeded", MSG_DRAINED)
            else:
                unknown_since = None
                idle_streak = 0
                rec.last_used_at = ctx.clock.now()
            if ctx.clock.monotonic() >= deadline_mono:
                return Outcome("failed", f"{MSG_DRAIN_DEADLINE}: {ctx.options.drain_deadline:.0f}s")
            await asyncio.sleep(ctx.options.drain_poll)

    async def drain(self, cmd: CommandIssued) -> Outcome:
        ctx = self.ctx
        rec = ctx.state.residencies.get(cmd.model_id)
        if rec is None or rec.process is None or rec.state == "cached":
            return Outcome("succeeded", MSG_ALREADY_ABSENT)
        if rec.state not in SERVING_STATES:
            return Outcome("failed", f"{MSG_RESIDENCY_BUSY}: {rec.state}")
        if rec.state == "ready":
            rec.state = "draining"
            ctx.save()
            # Leave routing at once: the heartbeat goes out before we wait for idleness.
            await ctx.heartbeat_now()
        outcome = await self.wait_idle(rec, ctx.clock.monotonic() + ctx.options.drain_deadline)
        ctx.save()
        return outcome

    # ------------------------------------------------------------------ evict
    async def evict(self, cmd: CommandIssued) -> Outcome:
        """Delete exactly the unused predictive download the command names, or refuse."""
        ctx = self.ctx
        digest, why = eviction.exact_sha256(cmd.artifact_sha256)
        if digest is None:
            return Outcome("failed", why)
        external = await asyncio.to_thread(ctx.external_models)
        why = eviction.residency_refusal(cmd.model_id, digest, ctx.state.residencies, external)
        if why:
            return Outcome("failed", why)
        try:
            result = await asyncio.to_thread(
                ctx.cache.evict, cmd.model_id, digest,
                lambda entry, index: eviction.index_refusal(cmd.model_id, digest, entry, index),
            )
        except OSError as exc:
            return Outcome("failed", f"{MSG_EVICT_FAILED}: {exc.strerror}")
        if result.refusal:
            return Outcome("failed", result.refusal)
        rec = ctx.state.residencies.get(cmd.model_id)
        if (rec is not None and rec.state == "cached" and rec.process is None
                and (rec.artifact_sha256 in (None, digest) or not ctx.cache.has_blob(rec.artifact_sha256))):
            # The cached-artifact residency had only the blob: it goes with it.
            ctx.state.residencies.pop(cmd.model_id, None)
            ctx.save()
        if result.absent and not result.reclaimed_bytes:
            return Outcome("succeeded", f"{MSG_ALREADY_ABSENT}: 0 bytes reclaimed")
        await ctx.heartbeat_now()  # the freed disk and the missing entry show at once
        return Outcome("succeeded", f"{MSG_EVICTED}: {result.reclaimed_bytes} bytes reclaimed")

    # ------------------------------------------------------------------ unload
    async def unload(self, cmd: CommandIssued) -> Outcome:
        ctx = self.ctx
        rec = ctx.state.residencies.get(cmd.model_id)
        if rec is None or rec.state == "cached" or (rec.process is None and rec.state != "failed"):
            if rec is not None and rec.state != "cached":
                ctx.release(rec, MSG_UNLOADED)
                ctx.save()
            return Outcome("succeeded", MSG_ALREADY_ABSENT)
        if rec.state in ("ready", "warming", "loading"):
            return Outcome("failed", f"{MSG_NOT_DRAINED}: {rec.state}")
        if rec.process is None:
            ctx.release(rec, MSG_UNLOADED)
            ctx.save()
            return Outcome("succeeded", MSG_ALREADY_ABSENT)
        proof = rec.process
        verdict = await asyncio.to_thread(llama_cpp.prove, proof)
        if verdict == llama_cpp.PROOF_GONE:
            ctx.release(rec, MSG_UNLOADED)
            ctx.save()
            await ctx.heartbeat_now()
            return Outcome("succeeded", MSG_ALREADY_ABSENT)
        if verdict != llama_cpp.PROOF_MATCH:
            rec.state = "failed"
            rec.note = NOTE_FENCED
            ctx.save()
            return Outcome("failed", f"{MSG_FENCED}: pid {proof.pid} {verdict}")
        if rec.state == "draining":
            # Final activity check at the unload boundary (drain before unload): a drain that
            # timed out leaves the child draining with work still in flight.
            active = await llama_cpp.probe_active(ctx.http, endpoint(rec), ctx.key, timeout=ACTIVITY_PROBE_TIMEOUT)
            if active is None:
                return Outcome("failed", MSG_ACTIVITY_UNKNOWN)
            if active > 0:
                return Outcome("failed", f"{MSG_REQUESTS_IN_FLIGHT}: {active}")
        rec.state = "unloading"
        ctx.save()
        ctx.poke()
        result = await asyncio.to_thread(
            llama_cpp.stop_process, proof, term_timeout=ctx.options.stop_term_timeout,
            kill_timeout=ctx.options.stop_kill_timeout, popen=ctx.popens.get(cmd.model_id),
        )
        if result in (llama_cpp.STOP_STOPPED, llama_cpp.STOP_ALREADY_GONE):
            ctx.release(rec, MSG_UNLOADED)
            ctx.save()
            await ctx.heartbeat_now()
            return Outcome("succeeded", MSG_UNLOADED)
        rec.state = "failed"
        rec.note = result
        ctx.save()
        ctx.poke()
        msg = MSG_FENCED if result == llama_cpp.STOP_NOT_PROVEN else MSG_STOP_TIMED_OUT
        return Outcome("failed", msg)

    # ------------------------------------------------------------------ shutdown
    async def drain_all(self) -> None:
        """Graceful stop: drain every proven child (bounded by the drain deadline), then stop it."""
        ctx = self.ctx
        live = [r for _, r in sorted(ctx.state.residencies.items()) if r.process is not None
                and r.state in ("ready", "draining", "failed", "warming", "unloading")]
        if not live:
            return
        for rec in live:
            if rec.state == "ready":
                rec.state = "draining"
        ctx.save()
        with contextlib.suppress(Exception):
            await ctx.heartbeat_now()
        deadline = ctx.clock.monotonic() + ctx.options.drain_deadline

        async def finish(rec: ResidencyRecord) -> None:
            if rec.state == "draining":
                outcome = await self.wait_idle(rec, deadline)
                if outcome.status != "succeeded":
                    ctx.warn(f"stop: {rec.model_id} {outcome.message}; left running")
                    return
            assert rec.process is not None
            result = await asyncio.to_thread(
                llama_cpp.stop_process, rec.process, term_timeout=ctx.options.stop_term_timeout,
                kill_timeout=ctx.options.stop_kill_timeout, popen=ctx.popens.get(rec.model_id),
            )
            if result in (llama_cpp.STOP_STOPPED, llama_cpp.STOP_ALREADY_GONE):
                ctx.release(rec, MSG_UNLOADED)
            else:
                ctx.warn(f"stop: {rec.model_id} {result}; left running")

        await asyncio.gather(*(finish(r) for r in live))
        ctx.save()


def kill_popen(popen: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        popen.kill()
    with contextlib.suppress(Exception):
        popen.wait(timeout=5)
