"""A starting router's catch-up on the heartbeat topic (router/fleet.py HeartbeatCatchUp):
it routes and rescues only once it has read the topic up to its end, the end as it is when
it gets there (members keep beating while it reads)."""

from __future__ import annotations

import asyncio

from evalstream.router.fleet import HeartbeatCatchUp


async def test_done_once_the_subscriber_is_at_the_end_read_after_reaching_the_first() -> None:
    catch_up = HeartbeatCatchUp()
    ends = iter([{0: 10, 1: 2}, {0: 12, 1: 2}, {0: 12, 1: 2}])
    reads: list[dict[int, int]] = []

    async def read_ends() -> dict[int, int]:
        reads.append(next(ends))
        return reads[-1]

    catch_up.seen(0, 3)  # read before the end offsets were asked: counted all the same
    running = asyncio.create_task(catch_up.run(read_ends, 5))
    await asyncio.sleep(0.01)
    catch_up.seen(0, 9)
    catch_up.seen(1, 1)  # the first ends reached; the topic has grown meanwhile
    await asyncio.sleep(0.01)
    assert not catch_up.done.is_set() and len(reads) == 2
    catch_up.seen(0, 11)
    assert await running is True and await catch_up.wait(0) is True
    assert len(reads) == 3  # done only when the end read after reaching the last is covered


async def test_an_empty_topic_is_read_at_once_and_every_wait_is_bounded() -> None:
    async def nothing() -> dict[int, int]:
        return {0: 0}

    empty = HeartbeatCatchUp()
    assert await empty.run(nothing, 1) is True

    async def five() -> dict[int, int]:
        return {0: 5}

    behind = HeartbeatCatchUp()
    assert await behind.run(five, 0.05) is False  # the router goes on with what it has read
    assert behind.behind() == {0: (0, 5)} and await behind.wait(0.01) is False


async def test_a_stopping_router_waits_no_more() -> None:
    catch_up = HeartbeatCatchUp()
    waiter = asyncio.create_task(catch_up.wait(60))
    await asyncio.sleep(0.01)
    catch_up.end()
    assert await asyncio.wait_for(waiter, 1) is False


async def test_a_catch_up_under_way_returns_once_the_router_stops_while_heartbeats_arrive() -> None:
    catch_up = HeartbeatCatchUp()

    async def far_end() -> dict[int, int]:
        return {0: 1_000_000}

    running = asyncio.create_task(catch_up.run(far_end, 60))
    for offset in range(50):  # members keep beating: progress, never the end
        catch_up.seen(0, offset)
        await asyncio.sleep(0)
    catch_up.end()
    catch_up.seen(0, 50)  # the progress that woke the wait in the stop's own turn
    assert await asyncio.wait_for(running, 5) is False
    assert not catch_up.done.is_set()
