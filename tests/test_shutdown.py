"""The optimizer's shutdown ends its tasks even when one swallows its cancellation, as Python 3.11's
``asyncio.wait_for`` inside a client library's connect can: a SIGTERM never leaves the daemon hanging."""

from __future__ import annotations

import asyncio

from optimizer.serve.service import _stop


async def test_a_task_that_swallows_its_cancellation_is_cancelled_again() -> None:
    """Deliberate bug caught: ``_stop`` cancelling once and awaiting each task (the shutdown hangs for good)."""
    swallowed = 0

    async def reconnecting() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if swallowed == 0:  # lost inside the library, as wait_for loses it when the connect completes
                    swallowed += 1
                    asyncio.current_task().uncancel()  # type: ignore[union-attr]
                    continue
                raise

    async def died() -> None:
        raise RuntimeError("broken before shutdown")

    tasks = [asyncio.create_task(reconnecting()), asyncio.create_task(died())]
    await asyncio.sleep(0.05)
    stopper = asyncio.create_task(_stop(tasks, every=0.05))
    done, _ = await asyncio.wait({stopper}, timeout=3)  # waits without cancelling the shutdown itself
    assert stopper in done, "the shutdown hangs on a task that swallowed its cancellation"
    assert swallowed == 1
    assert all(t.done() for t in tasks)
