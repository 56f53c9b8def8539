"""cancel_and_wait ends a task even when the task swallows a cancellation."""

from __future__ import annotations

import asyncio
import sys

from grid.tasks import cancel_and_wait


async def test_a_task_that_swallows_its_cancellation_is_cancelled_again_until_it_ends() -> None:
    loop = asyncio.get_running_loop()
    gates: list[asyncio.Future[None]] = []

    async def publishing_loop() -> None:
        # What nats-py does for every request: wait for the reply with wait_for.
        while True:
            gate = loop.create_future()
            gates.append(gate)
            await asyncio.wait_for(gate, 10.0)

    task = asyncio.create_task(publishing_loop())
    await asyncio.sleep(0)
    # The reply and the cancellation land in the same loop iteration.
    gates[-1].set_result(None)
    task.cancel()
    await asyncio.sleep(0.05)
    if sys.version_info < (3, 12):
        assert not task.done() and len(gates) == 2, "Python 3.11's wait_for swallows this cancellation"
    await asyncio.wait_for(cancel_and_wait([task]), 5.0)
    assert task.cancelled()


async def test_finished_failed_and_missing_tasks_are_reaped_quietly() -> None:
    async def fails() -> None:
        raise ValueError("outcome dropped")

    failed = asyncio.create_task(fails())
    done = asyncio.create_task(asyncio.sleep(0))
    await asyncio.sleep(0.01)
    sleeper = asyncio.create_task(asyncio.sleep(30))
    await cancel_and_wait([failed, done, None, sleeper])
    assert failed.done() and done.done() and sleeper.cancelled()
