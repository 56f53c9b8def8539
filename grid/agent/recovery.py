"""Recovery at start and adoption of children that outlived their agent.

At start the persisted in-flight action becomes a failed receipt (its side effect may be half
done; the controller decides again), and every recorded child is proven (pid, exe, cmdline,
birth time) before it is adopted: a proven, healthy child is ready again; a proven but unhealthy
one is kept out of routing until it answers; anything unprovable is fenced and never signalled.
While running, the heartbeat loop calls `check_children` to notice children that died.

The state file is not the only record: every child carries its owner token (grid.agent.ownership).
After the recorded children are settled, `adopt_owned` finds every live child with our token
that no record holds (the state file was lost, quarantined, or its proof damaged) and adopts it
when it is provably a serving engine of this host and model, or stops it otherwise, so damaged
local state never orphans an engine and never leads to a duplicate one. Engines whose agent does
not come back within the grace are stopped by the directory's warden (grid.agent.warden).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import structlog

from grid.agent.context import AgentContext, endpoint
from grid.agent.engines import llama_cpp
from grid.agent.outcomes import MSG_INTERRUPTED, NOTE_ADOPTED, NOTE_EXITED, NOTE_FENCED, NOTE_UNHEALTHY
from grid.agent.ownership import OwnedEngine, find_owned_engines
from grid.agent.state import AgentPaths, AgentState, ProcessProof, Receipt, ResidencyRecord, decode_state
from grid.events import codec
from grid.events.host import HostHeartbeat
from grid.events.log import EventLog
from grid.events.subjects import host_subject
from grid.fleet import SERVING_STATES
from grid.procstart import CREATE_TIME_TOLERANCE_SECONDS, starts_match

log = structlog.get_logger("grid.agent")

# How long a restarted agent waits for a recorded ready child to answer /health.
ADOPT_HEALTH_SECONDS = 10.0


async def recover(ctx: AgentContext) -> None:
    st = ctx.state
    if st.in_flight is not None:
        fl = st.in_flight
        st.add_receipt(
            Receipt(
                action_id=fl.action_id, kind=fl.kind, model_id=fl.model_id, status="failed",
                message=MSG_INTERRUPTED, duration_seconds=None, generation=fl.generation,
                controller_term=fl.controller_term, finished_at=ctx.clock.now(), published=False,
            )
        )
        st.in_flight = None
    for model_id in sorted(st.residencies):
        await recover_residency(ctx, st.residencies[model_id])
    await adopt_owned(ctx)
    if any(rec.process is not None for rec in st.residencies.values()):
        # Kept engines are watched again from now on (a warden that outlived our previous
        # incarnation is still watching; then this is a no-op).
        await ctx.guard_engines()


async def recover_residency(ctx: AgentContext, rec: ResidencyRecord) -> None:
    proof = await asyncio.to_thread(
        llama_cpp.complete_proof, rec.process, port=rec.port,
        spawn_argv=rec.spawn_argv, spawn_started_at=rec.spawn_started_at,
    )
    if proof is None:
        if rec.state in ("loading", "warming", "ready", "draining", "unloading"):
            ctx.release(rec, "no process recorded")
        return
    rec.process = proof
    verdict = await asyncio.to_thread(llama_cpp.prove, proof)
    if verdict == llama_cpp.PROOF_GONE:
        ctx.release(rec, "child gone while the agent was down")
        return
    if verdict != llama_cpp.PROOF_MATCH:
        rec.state = "failed"
        rec.note = NOTE_FENCED
        ctx.warn(f"residency {rec.model_id}: pid {proof.pid} {verdict}; fenced, never signalled")
        return
    # A child interrupted while warming may still be loading its model.
    wait = ctx.options.ready_timeout if rec.state == "warming" else ADOPT_HEALTH_SECONDS
    if not await _healthy_within(ctx, rec, wait):
        # Proven ours but not ready: kept (unload may still stop it), never routed; the
        # heartbeat loop promotes it to ready if it becomes healthy.
        rec.state = "failed"
        rec.note = NOTE_UNHEALTHY
        return
    if rec.state in ("warming", "ready", "failed"):
        rec.state = "ready"
    elif rec.state == "unloading":
        rec.state = "draining"
    if rec.loaded_at is None:
        rec.loaded_at = ctx.clock.now()
    rec.note = NOTE_ADOPTED
    log.info("agent.adopted", model_id=rec.model_id, pid=proof.pid, port=proof.port)


async def _healthy_within(ctx: AgentContext, rec: ResidencyRecord, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await llama_cpp.probe_health(ctx.http, endpoint(rec), ctx.key, timeout=1.0):
            return True
        await asyncio.sleep(0.1)
    return False


# ---------------------------------------------------------------------- found by owner token
def recover_host_id(paths: AgentPaths, token: str) -> tuple[str, str] | None:
    """The host id an agent with a lost/empty host_id file had: from the state file if it still
    decodes, else from the one host id its live children carry. Returns (host id, source)."""
    try:
        host_id = decode_state(paths.state.read_bytes()).host_id
        if host_id:
            return host_id, "state file"
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        pass
    ids = sorted({e.host_id for e in find_owned_engines(token) if e.host_id})
    if len(ids) == 1:
        return ids[0], "running engines"
    return None


def _same_process(a: ProcessProof, b: ProcessProof) -> bool:
    return a.pid == b.pid and starts_match(a.start_stamp, a.create_time, b.start_stamp, b.create_time,
                                           tolerance=CREATE_TIME_TOLERANCE_SECONDS)


def _tracked(ctx: AgentContext, engine: OwnedEngine) -> bool:
    return any(
        r.process is not None and _same_process(r.process, engine.proof) for r in ctx.state.residencies.values()
    )


def _why_not_adoptable(ctx: AgentContext, engine: OwnedEngine) -> str | None:
    if not engine.model_id or not engine.proof.port:
        return "unrecognised command line"
    if engine.host_id != ctx.state.host_id:
        return f"started for host {engine.host_id!r}"
    if Path(engine.key_file) != ctx.paths.engine_key:
        return "started with another key file"
    rec = ctx.state.residencies.get(engine.model_id)
    if rec is not None and rec.process is not None and not (rec.state == "failed" and rec.note == NOTE_FENCED):
        return f"duplicate of pid {rec.process.pid} for {engine.model_id}"
    return None


def _artifact_sha(ctx: AgentContext, model_path: str) -> str | None:
    path = Path(model_path)
    if path.parent == ctx.cache.blobs and path.suffix == ".gguf" and ctx.cache.has_blob(path.stem):
        return path.stem
    return None


async def adopt_owned(ctx: AgentContext) -> None:
    """Adopt or stop every live child with our owner token that no record holds."""
    engines = await asyncio.to_thread(find_owned_engines, ctx.owner.token)
    for engine in engines:
        if _tracked(ctx, engine):
            continue
        why = _why_not_adoptable(ctx, engine)
        if why is not None:
            await stop_owned(ctx, engine, why)
            continue
        rec = ctx.state.residencies.get(engine.model_id)
        if rec is None:
            rec = ResidencyRecord(model_id=engine.model_id, state="warming")
            ctx.state.residencies[engine.model_id] = rec
        rec.process = engine.proof
        rec.port = engine.proof.port
        rec.slots = engine.slots
        rec.context_size = engine.context_size
        rec.memory_mb = engine.memory_mb or rec.memory_mb
        rec.model_path = engine.model_path
        rec.artifact_sha256 = rec.artifact_sha256 or _artifact_sha(ctx, engine.model_path)
        rec.spawn_argv = None
        rec.spawn_started_at = None
        ctx.warn(f"residency {engine.model_id}: pid {engine.proof.pid} found by owner token, not in the state file")
        if await _healthy_within(ctx, rec, ctx.options.ready_timeout):
            rec.state = "ready"
            rec.note = NOTE_ADOPTED
            rec.loaded_at = rec.loaded_at or ctx.clock.now()
            log.info("agent.adopted", model_id=rec.model_id, pid=engine.proof.pid, port=engine.proof.port,
                     found_by="owner_token")
        else:
            # Ours but not serving: kept out of routing, retried by the heartbeat loop, stopped
            # by unload or a graceful stop like any other child.
            rec.state = "failed"
            rec.note = NOTE_UNHEALTHY
    ctx.save()


async def stop_owned(ctx: AgentContext, engine: OwnedEngine, why: str) -> None:
    result = await asyncio.to_thread(
        llama_cpp.stop_process, engine.proof, term_timeout=ctx.options.stop_term_timeout,
        kill_timeout=ctx.options.stop_kill_timeout,
    )
    ctx.warn(f"owned engine pid {engine.proof.pid} ({engine.model_id or '?'}) not adoptable: {why}; {result}")


async def stop_untracked(ctx: AgentContext) -> None:
    """At a graceful stop: no child carrying our token outlives the agent unless a record still
    holds it (a drain that could not finish is reported, not hidden)."""
    for engine in await asyncio.to_thread(find_owned_engines, ctx.owner.token):
        if not _tracked(ctx, engine):
            await stop_owned(ctx, engine, "not held by any residency at stop")


async def restore_fence_from_log(log: EventLog, state: AgentState, warn: Callable[[str], None]) -> None:
    """Raise the fence to the term this host last reported in the log.

    The state file is the durable fence; when it was lost or quarantined, this host's own last
    heartbeat still carries `highest_term`, so the fence never silently falls to 0. (The term's
    controller id is not in the heartbeat: the next command of that term records it.)"""
    try:
        # By its subject: a host may read back its own events, never the whole stream.
        msg = await log.last_message(host_subject(state.host_id, "heartbeat"))
        if msg is not None:
            authorship = getattr(log, "authorship", None)
            # Only a heartbeat this very key signed: anyone able to make the server store bytes
            # on our subject could otherwise raise our fence out of every controller's reach.
            if authorship is not None and authorship.verify(msg.subject, msg.data, msg.headers,
                                                            at=msg.time).signer != authorship.public_key:
                warn("fence_unverified: the last heartbeat on our subject is not signed by this host")
                return
            event = codec.decode(msg.data)
            if not isinstance(event, HostHeartbeat) or event.host_id != state.host_id:
                return
            if event.highest_term > state.highest_term:
                warn(f"fence_restored_from_log: term {event.highest_term} (state file had {state.highest_term})")
                state.highest_term = event.highest_term
                state.term_controller_id = ""
    except Exception as exc:  # the fence stays what the file said; say so
        warn(f"fence_unverified: the log could not be read ({type(exc).__name__})")


async def check_children(ctx: AgentContext, busy_model: str | None) -> None:
    """A ready/draining child that died releases its handle (reported as cached); an adopted
    child that was not healthy yet is retried. `busy_model` is the in-flight action's model,
    which the worker owns until it finishes."""
    changed = False
    for model_id in sorted(ctx.state.residencies):
        rec = ctx.state.residencies[model_id]
        if model_id == busy_model or rec.process is None:
            continue
        if rec.state == "failed" and rec.note == NOTE_UNHEALTHY:
            changed |= await retry_adoption(ctx, rec)
            continue
        if rec.state not in SERVING_STATES:
            continue
        popen = ctx.popens.get(model_id)
        if popen is not None and popen.poll() is not None:
            verdict = llama_cpp.PROOF_GONE
        else:
            verdict = await asyncio.to_thread(llama_cpp.prove, rec.process)
        if verdict == llama_cpp.PROOF_GONE:
            ctx.release(rec, NOTE_EXITED)
            ctx.warn(f"residency {model_id}: engine exited unexpectedly")
            changed = True
    if changed:
        ctx.save()


async def retry_adoption(ctx: AgentContext, rec: ResidencyRecord) -> bool:
    assert rec.process is not None
    verdict = await asyncio.to_thread(llama_cpp.prove, rec.process)
    if verdict == llama_cpp.PROOF_GONE:
        ctx.release(rec, NOTE_EXITED)
        return True
    if verdict == llama_cpp.PROOF_MATCH and await llama_cpp.probe_health(
        ctx.http, endpoint(rec), ctx.key, timeout=1.0
    ):
        rec.state = "ready"
        rec.note = NOTE_ADOPTED
        rec.loaded_at = rec.loaded_at or ctx.clock.now()
        return True
    return False
