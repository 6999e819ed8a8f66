"""The router's parking policy (router/parking.py), on clocks the test moves."""

from __future__ import annotations

from evalstream.common.messages import GenerationParams, Item, Shard
from evalstream.router.parking import ParkingPolicy
from evalstream.router.routing import Blocked


class Clock:
    def __init__(self) -> None:
        self.mono = 1000.0
        self.wall = 1_700_000_000.0

    def advance(self, s: float) -> None:
        self.mono += s
        self.wall += s


def shard(model: str = "hf:m", group: str | None = None, parked_at: float = 0.0) -> Shard:
    return Shard(
        run_id="r",
        shard_id="r-0",
        shard_index=0,
        shard_count=1,
        model=model,
        grader="exact",
        generation=GenerationParams(),
        items=[Item(id="1", question="q", answer="a")],
        worker_group=group,
        parked_at=parked_at,
    )


def policy(clock: Clock, *, can_park: bool = True, **kw: float) -> ParkingPolicy:
    return ParkingPolicy(
        park_after_s=kw.get("park_after_s", 5.0),
        park_timeout_s=kw.get("park_timeout_s", 3600.0),
        no_group_timeout_s=kw.get("no_group_timeout_s", 120.0),
        can_park=can_park,
        max_targets=int(kw.get("max_targets", 1024)),
        monotonic=lambda: clock.mono,
        wall=lambda: clock.wall,
    )


def test_the_first_shard_waits_park_after_s_then_gives_up_on_no_group_only() -> None:
    clock = Clock()
    p = policy(clock)
    wait = p.wait_for(shard(), known=lambda: True)
    assert not wait.give_up(Blocked.NO_GROUP)
    clock.advance(4.9)
    assert not wait.give_up(Blocked.NO_GROUP)
    clock.advance(0.2)
    assert wait.give_up(Blocked.NO_GROUP)
    assert not wait.give_up(Blocked.SATURATED)  # back-pressure is always waited out
    assert not wait.unroutable()  # a known model's group may come back: park, don't drop


def test_shards_behind_a_parked_one_park_at_once_for_the_same_target_only() -> None:
    clock = Clock()
    p = policy(clock)
    first = shard()
    p.parked(first)
    clock.advance(1.0)
    assert p.wait_for(shard(), known=lambda: True).give_up(Blocked.NO_GROUP)
    other = p.wait_for(shard(model="hf:other"), known=lambda: True)
    assert not other.give_up(Blocked.NO_GROUP)
    pinned = p.wait_for(shard(group="g1"), known=lambda: True)
    assert not pinned.give_up(Blocked.NO_GROUP)
    clock.advance(5.0)  # the last park is older than the interval: wait again
    assert not p.wait_for(shard(), known=lambda: True).give_up(Blocked.NO_GROUP)


def test_unroutable_after_the_no_group_or_park_timeout() -> None:
    clock = Clock()
    p = policy(clock, no_group_timeout_s=120.0, park_timeout_s=3600.0)
    never_served = p.wait_for(shard(parked_at=clock.wall - 121), known=lambda: False)
    assert never_served.unroutable()
    served_before = p.wait_for(shard(parked_at=clock.wall - 121), known=lambda: True)
    assert not served_before.unroutable()
    long_dead = p.wait_for(shard(parked_at=clock.wall - 3601), known=lambda: True)
    assert long_dead.unroutable()
    fresh = p.wait_for(shard(), known=lambda: False)
    assert fresh.parked_at == clock.wall and not fresh.unroutable()


def test_without_a_retry_topic_a_shard_waits_until_unroutable() -> None:
    clock = Clock()
    p = policy(clock, can_park=False, no_group_timeout_s=120.0)
    wait = p.wait_for(shard(), known=lambda: False)
    clock.advance(10.0)  # past park_after_s, but there is nowhere to park
    assert not wait.give_up(Blocked.NO_GROUP)
    clock.advance(111.0)
    assert wait.give_up(Blocked.NO_GROUP) and wait.unroutable()


def test_parked_shards_come_back_less_often_the_longer_they_wait() -> None:
    clock = Clock()
    p = policy(clock)
    assert p.interval(clock.wall) == 5.0
    assert p.interval(clock.wall - 60) == 15.0
    assert p.interval(clock.wall - 3600) == 30.0
    wait = p.wait_for(shard(parked_at=clock.wall - 60), known=lambda: True)
    assert wait.not_before() == clock.wall + 15.0


def test_remembered_targets_are_bounded() -> None:
    clock = Clock()
    p = policy(clock, max_targets=10)
    for n in range(100):
        p.parked(shard(model=f"hf:m{n}"))
        clock.advance(0.01)
    assert len(p._last_parked) <= 10
    # the newest target is kept: the shards behind it still park at once
    assert p.wait_for(shard(model="hf:m99"), known=lambda: True).give_up(Blocked.NO_GROUP)
