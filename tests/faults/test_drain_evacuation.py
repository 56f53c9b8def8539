"""Draining the host of a single-copy model costs no request (issue 25 item 4).

`gridctl node drain` on the host holding the only replica is a make-before-break evacuation:
the planner places a replacement on the other host and retains the draining copy, the gateway
keeps routing to it (after every admitting host) while it is ready, and the reconciler drains
and unloads it only once the replacement is ready (or, while another host serves the model, the
60 s evacuation deadline passed: the last ready copy always waits for its replacement).
Before, the gateway dropped the draining host at once: about 20 s of `503 model_not_ready` until
the replacement was ready.

Real parts: `gridctl test start --machines 2` (NATS with identities, controller, gateway, two
agents that joined by invitation, llama.cpp with the SmolLM2 GGUF), a steady sequential load
through the gateway, the operator's `gridctl node drain` on the holder's machine.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from grid.agent.engines.runtime import Runtime
from grid.fleet import REPLICA_STATES
from grid.testfleet import fleet as fleetlib
from grid.testfleet.state import load_state
from tests.e2e.test_fleet import wait_until
from tests.faults.fleetkit import MODEL, Fleet, ask, two_machines

pytestmark = pytest.mark.engine

HOSTS = {"h1", "h2"}
REQUESTS_BEFORE_DRAIN = 4
# Bound on the whole evacuation: replacement load + warm, then drain and unload of the old copy
# (the evacuation deadline is 60 s; minimum residency may hold the old copy until then).
EVACUATION_BOUND_SECONDS = 240.0


def residencies(fleet: Fleet) -> dict[str, set[str]]:
    """host -> {model's live residency states} (fresh hosts only)."""
    return {h["host_id"]: {r["state"] for r in h["residencies"] if r["model_id"] == MODEL and r["state"] in REPLICA_STATES}
            for h in fleet.hosts() if h["fresh"]}


def single_copy(fleet: Fleet) -> str | None:
    """The host holding the model's only live copy, ready, or None."""
    live = {h: s for h, s in residencies(fleet).items() if s}
    if len(live) == 1:
        (holder, states), = live.items()
        if states == {"ready"}:
            return holder
    return None


@pytest.fixture
def fleet(tmp_path: Path, bundled_model_home: Path, engine_runtime: Runtime) -> Iterator[Fleet]:
    with two_machines(tmp_path, bundled_model_home) as started:
        yield started


def test_draining_the_only_replicas_host_costs_no_request(fleet: Fleet) -> None:
    fleet.admin("PATCH", f"/allocator/models/{MODEL}", {"min_replicas": 1, "max_replicas": 1})
    holder = wait_until("one ready copy of the model, on one host", lambda: single_copy(fleet), 240, interval=1.0)
    other = next(iter(HOSTS - {holder}))
    client = httpx.Client(base_url=fleet.gateway, timeout=120)
    wait_until("the gateway serving the model", lambda: ask(client, False) == (200, holder), 60, interval=1.0)
    state = load_state(fleet.home / "testfleet")
    assert state is not None

    results: list[tuple[float, int, str | None]] = []
    drained_at = 0.0
    evacuated_at = 0.0
    i = 0
    while True:
        if i == REQUESTS_BEFORE_DRAIN:
            drained = fleetlib.host_cli(state, holder, "node", "drain", "--reason", "evacuation test")
            assert drained.returncode == 0, drained.stderr
            drained_at = time.monotonic()
        status, host = ask(client, stream=i % 2 == 1)
        results.append((time.monotonic(), status, host))
        i += 1
        if drained_at and not evacuated_at and i % 4 == 0:
            now = residencies(fleet)
            if now.get(other) == {"ready"} and not now.get(holder):
                evacuated_at = time.monotonic()
        if evacuated_at and time.monotonic() - evacuated_at > 3.0:
            break  # a few more requests after the old copy is gone
        assert time.monotonic() - (drained_at or time.monotonic()) < EVACUATION_BOUND_SECONDS, (
            f"not evacuated within {EVACUATION_BOUND_SECONDS:.0f}s: {residencies(fleet)}")
    after = results[REQUESTS_BEFORE_DRAIN:]
    failed = [(round(t - drained_at, 2), status, host) for t, status, host in after if status != 200]
    served = [host for _, _, host in after]
    first_new = next((round(t - drained_at, 1) for t, _, h in after if h == other), None)
    last_old = max((round(t - drained_at, 1) for t, _, h in after if h == holder), default=None)
    print(f"\nevacuation of {holder} ({evacuated_at - drained_at:.1f}s to the old copy's unload): "
          f"{len(after)} requests, {len(failed)} failed; served by {holder}: {served.count(holder)} "
          f"(last at +{last_old}s), by {other}: {served.count(other)} (first at +{first_new}s); failed: {failed[:3]}...")
    assert not failed, f"requests failed while {holder} was drained: {failed}"
    # The old copy served until the new one was ready, then the new one took over for good.
    assert served[0] == holder and served[-1] == other
    last_k = max(k for k, h in enumerate(served) if h == holder)
    assert all(h == other for h in served[last_k + 1:])
    # The drained host's engine is unloaded: no live residency of the model there.
    assert not residencies(fleet).get(holder)
    status = fleetlib.host_cli(state, holder, "node", "status", "--json")
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["protection_state"] == "draining"
    assert not [r for r in report.get("residencies", []) if r["model_id"] == MODEL and r["state"] in REPLICA_STATES]
    client.close()
