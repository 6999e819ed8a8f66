"""cancel_and_wait stops a task that swallows its cancellation, as Python 3.11's
asyncio.wait_for does when what it waits on finishes in the same loop turn (the router's lag
monitor did, and the router then never exited on SIGTERM)."""

from __future__ import annotations

import asyncio
import contextlib
import sys

import pytest

from evalstream.common import tasks


async def _waits_on_an_event_in_a_loop(event: asyncio.Event) -> None:
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), 5)
        event.clear()


async def test_a_task_cancelled_as_its_wait_for_finishes_is_stopped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    event = asyncio.Event()
    task = asyncio.create_task(_waits_on_an_event_in_a_loop(event))
    await asyncio.sleep(0.01)
    event.set()  # the wait finishes in the same turn as the cancellation below
    assert await tasks.cancel_and_wait(task, "waiter", timeout_s=5)
    assert task.done()
    if sys.version_info < (3, 12):  # the race this guards against happened: one cancel was lost
        assert "waiter swallowed 1 cancellations" in caplog.text


async def test_a_task_that_never_stops_is_given_up_on_after_the_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(10)

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    assert not await tasks.cancel_and_wait(task, "stubborn", timeout_s=0.3)
    assert "stubborn did not stop within" in caplog.text
    release.set()
    assert await tasks.cancel_and_wait(task, "stubborn", timeout_s=5)


async def test_a_task_that_failed_is_reported_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(fails())
    await asyncio.sleep(0)
    assert await tasks.cancel_and_wait(task, "failing", timeout_s=1)
    assert "failing failed: RuntimeError('boom')" in caplog.text


async def test_wait_event_keeps_a_cancellation_that_races_the_event() -> None:
    event = asyncio.Event()

    async def waits_in_a_loop() -> None:
        while True:
            await tasks.wait_event(event, 5)
            event.clear()

    task = asyncio.create_task(waits_in_a_loop())
    await asyncio.sleep(0.01)
    event.set()
    task.cancel()  # the same turn as the set: wait_for would return and loop on
    await asyncio.wait({task}, timeout=1)
    assert task.cancelled()


async def test_wait_event_says_whether_the_event_came() -> None:
    event = asyncio.Event()
    assert await tasks.wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await tasks.wait_event(event, 5) is True
