"""Publishing many messages without waiting on each: a sliding window of sends in flight.

One `await broker.publish(...)` per message waits for the broker's acknowledgement before the
next send starts: a run's 600 shards one after another cost 600 round trips. Thousands of
sends at once outrun the Kafka client's buffer instead, and time out. In between: at most
WINDOW messages and about WINDOW_BYTES in flight, a send started as soon as the oldest one
is acknowledged. `messages` may be a generator, or an asynchronous one: only the window is
held, so memory does not grow with the number of messages.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable
from typing import TypeVar

WINDOW = 256  # messages in flight at once
WINDOW_BYTES = 2 * 1024 * 1024  # and at most about this much of them

Send = Callable[[bytes, bytes], Awaitable[None]]  # (payload, key): one acknowledged send
T = TypeVar("T")


async def each(things: Iterable[T] | AsyncIterable[T]) -> AsyncIterator[T]:
    """The things of a plain or an asynchronous iterable (a query streamed from a cursor)."""
    if isinstance(things, AsyncIterable):
        async for thing in things:
            yield thing
    else:
        for thing in things:
            yield thing


async def publish_all(
    messages: Iterable[tuple[bytes, bytes]] | AsyncIterable[tuple[bytes, bytes]],
    send: Send,
    *,
    window: int | None = None,
    window_bytes: int | None = None,
) -> None:
    """Sends every (payload, key) of `messages`; returns once all are acknowledged. The
    first failed send raises, and the sends still in flight are cancelled (whoever asked
    publishes again: the receivers drop what was recorded already)."""
    most = WINDOW if window is None else window
    most_bytes = WINDOW_BYTES if window_bytes is None else window_bytes
    pending: deque[tuple[asyncio.Future[None], int]] = deque()
    size = 0
    try:
        async for payload, key in each(messages):
            while pending and (len(pending) >= most or size + len(payload) > most_bytes):
                oldest, n = pending.popleft()
                await oldest
                size -= n
            pending.append((asyncio.ensure_future(send(payload, key)), len(payload)))
            size += len(payload)
        while pending:
            await pending[0][0]
            pending.popleft()
    finally:
        for task, _ in pending:
            task.cancel()
        await asyncio.gather(*(task for task, _ in pending), return_exceptions=True)
