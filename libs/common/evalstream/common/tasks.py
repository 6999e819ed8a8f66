"""Stopping a background task for certain.

`task.cancel(); await task` hangs for ever when the task swallows the cancellation, and in
Python 3.11 it can without meaning to: `asyncio.wait_for` returns its inner result instead of
raising CancelledError when the awaited thing finishes in the same loop turn as the cancel
(gh-86296, fixed in 3.12), and some client libraries catch CancelledError while closing. A
service whose shutdown waits on such a task never exits on SIGTERM. `wait_event` waits
without that race; `cancel_and_wait` cancels again until the task is done, bounded, for
whatever else may swallow one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

log = logging.getLogger("evalstream.tasks")

RECANCEL_EVERY_S = 0.5  # a swallowed cancellation is repeated after this long


async def cancel_and_wait(task: asyncio.Task[object], what: str, timeout_s: float = 10.0) -> bool:
    """Cancels `task` until it is done, for at most `timeout_s`; True once it is done. Its
    outcome (a result, an error, the cancellation) is consumed, not raised."""
    deadline = time.monotonic() + timeout_s
    cancels = 0
    while not task.done():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            log.error("%s did not stop within %.0f s of %d cancellations", what, timeout_s, cancels)
            return False
        task.cancel()
        cancels += 1
        await asyncio.wait({task}, timeout=min(RECANCEL_EVERY_S, remaining))
    if cancels > 1:
        log.warning("%s swallowed %d cancellations before it stopped", what, cancels - 1)
    if not task.cancelled() and (error := task.exception()) is not None:
        log.error("%s failed: %r", what, error)
    return True


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Waits for `event` at most `timeout_s`; True once set. Unlike 3.11's
    `asyncio.wait_for(event.wait(), ...)` it never swallows a cancellation (no inner task)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
    return event.is_set()
