"""The router's view of the worker fleet: members from heartbeats, load from consumer lag.

Liveness is the shared rule (evalstream.common.fleet): a member is live while its last
heartbeat is younger than ROUTER_HEARTBEAT_TIMEOUT_S and it is ready or starting; a group
with no live member is dead and gets no new shards.

A group's outstanding work is counted in shards: the consumer lag of its consumer group on
its work topic (read periodically from Kafka), plus the shards this router sent it since
that read began, so that a burst between two reads is not routed blind. The same reads give
its drain rate: shards committed per second over an interval it stayed backlogged.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from evalstream.common import fleet
from evalstream.common.messages import Heartbeat
from evalstream.common.specs import serves
from evalstream.common.tasks import wait_event
from evalstream.router.policy import GroupView

RATE_SMOOTHING = 0.3  # weight of the newest drain-rate sample (exponential moving average)


@dataclass
class Group:
    name: str
    model: str  # SPEC patterns, as advertised by its workers
    members: dict[str, Heartbeat] = field(default_factory=dict)
    last_seen: float = 0.0  # newest heartbeat of any member, stopped ones included
    lag: int = 0  # last measured consumer lag (shards)
    lag_at: float = 0.0  # when it was measured (0: never)
    routed: int = 0  # shards this router sent here, ever
    routed_at_read: int = 0  # `routed` when the last lag read began
    drain_rate: float | None = None

    def live_members(self, now: float, timeout_s: float) -> list[Heartbeat]:
        return fleet.live_members(self.members.values(), now, timeout_s)

    @property
    def outstanding(self) -> int:
        return self.lag + self.routed - self.routed_at_read

    def record_lag(self, lag: int, routed_at_read: int, now: float) -> None:
        """A lag read that began when `routed` was `routed_at_read` finished at `now`."""
        if self.lag_at and self.lag > 0 and lag > 0 and now > self.lag_at:
            # backlogged at both reads: what left the queue is what the group could do
            done = self.lag + (routed_at_read - self.routed_at_read) - lag
            sample = max(0, done) / (now - self.lag_at)
            self.drain_rate = (
                sample
                if self.drain_rate is None
                else (1 - RATE_SMOOTHING) * self.drain_rate + RATE_SMOOTHING * sample
            )
        self.lag, self.routed_at_read, self.lag_at = lag, routed_at_read, now

    def view(self, now: float, timeout_s: float, max_lag: int) -> GroupView:
        live = self.live_members(now, timeout_s)
        util = [
            u
            for hb in live
            if (u := hb.gpu_utilization if hb.gpu_utilization is not None else hb.cpu_utilization) is not None
        ]
        return GroupView(
            name=self.name,
            members=len(live),
            outstanding=self.outstanding,
            capacity=max_lag * len(live),
            p95_ms=sum(hb.latency_p95_ms for hb in live) / len(live) if live else 0.0,
            utilization=sum(util) / len(util) if util else None,
            memory_pressure=fleet.memory_pressure(live),
            drain_rate=self.drain_rate,
        )


class Fleet:
    def __init__(self, heartbeat_timeout_s: float = 15.0, groups: str = "*", max_lag: int = 32) -> None:
        self.groups: dict[str, Group] = {}
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.max_lag = max_lag
        # shell patterns of the group names this router may use (ROUTER_GROUPS)
        self.patterns = [p.strip() for p in groups.split(",") if p.strip()]

    def admits(self, group: str) -> bool:
        return any(fnmatchcase(group, p) for p in self.patterns)

    def observe(self, hb: Heartbeat) -> bool:
        """Takes a heartbeat in; False if its group is not one this router uses."""
        if not self.admits(hb.group):
            return False
        group = self.groups.setdefault(hb.group, Group(hb.group, hb.model))
        group.model = hb.model
        group.last_seen = max(group.last_seen, hb.ts)
        if hb.status == "stopped":
            group.members.pop(hb.worker_id, None)
        else:
            group.members[hb.worker_id] = hb
        return True

    def forget(self, worker_id: str) -> None:
        """A tombstone on the compacted topic: the worker left for good."""
        for g in self.groups.values():
            g.members.pop(worker_id, None)

    def is_live(self, group: Group, now: float) -> bool:
        return bool(group.live_members(now, self.heartbeat_timeout_s))

    def eligible(self, model: str, pinned: str | None = None, now: float | None = None) -> list[Group]:
        """Healthy groups that serve `model` (only `pinned`, if the run pins a group)."""
        now = time.time() if now is None else now
        return [
            g
            for g in self.groups.values()
            if (pinned is None or g.name == pinned) and serves(g.model, model) and self.is_live(g, now)
        ]

    def views(self, model: str, pinned: str | None, now: float) -> list[GroupView]:
        return [
            g.view(now, self.heartbeat_timeout_s, self.max_lag) for g in self.eligible(model, pinned, now)
        ]

    def live_views(self, now: float) -> list[GroupView]:
        return [
            g.view(now, self.heartbeat_timeout_s, self.max_lag)
            for g in self.groups.values()
            if self.is_live(g, now)
        ]

    def known(self, model: str, pinned: str | None = None) -> bool:
        """Whether any group, healthy or not, has ever served `model`: shards for it wait
        (their group may come back) instead of being dead-lettered."""
        return any(
            (pinned is None or g.name == pinned) and serves(g.model, model) for g in self.groups.values()
        )

    def serving(self, model: str) -> Callable[[str], bool]:
        """A predicate: does the named group serve `model`?"""
        return lambda name: name in self.groups and serves(self.groups[name].model, model)

    def dead_for(self, group: Group, now: float) -> float | None:
        """Seconds since the group was declared dead (its newest heartbeat plus the
        timeout), or None while it has a live member."""
        if self.is_live(group, now):
            return None
        return max(0.0, now - group.last_seen - self.heartbeat_timeout_s)

    def health(self, group: Group, now: float) -> str:
        return fleet.group_health(len(group.live_members(now, self.heartbeat_timeout_s)), len(group.members))


class HeartbeatCatchUp:
    """Whether this router has read the heartbeat topic up to its end.

    Until then its view of the fleet is partial: a group that serves a model may be unknown
    (its shards would park), a live group may look dead from an old heartbeat (its pending
    shards would be rescued from it) and the SLA window may lack the samples that step a model
    down. The topic is compacted but keeps every member's latest heartbeat, poison included
    until a router has dead-lettered it, so reading it can take seconds, while members keep
    beating: the end it must reach is the end *when it gets there*. `run` reads the end
    offsets, waits for the subscriber (`seen`) to reach them, reads them again, and is done
    when the subscriber is at the end it has just read; `wait` waits for that, bounded."""

    def __init__(self) -> None:
        self.done = asyncio.Event()
        self._ended = asyncio.Event()  # the router stops: nobody waits any more
        self._seen: dict[int, int] = {}  # partition -> next offset to read
        self._ends: dict[int, int] = {}  # the last end offsets read
        self._progress = asyncio.Event()

    def seen(self, partition: int, offset: int) -> None:
        self._seen[partition] = max(self._seen.get(partition, 0), offset + 1)
        self._progress.set()

    def covers(self, ends: dict[int, int]) -> bool:
        return all(self._seen.get(p, 0) >= end for p, end in ends.items())

    async def run(self, read_ends: Callable[[], Awaitable[dict[int, int]]], timeout_s: float) -> bool:
        """Sets `done` once the subscriber has read up to the end; False after `timeout_s`
        or once the router stops (`end`)."""
        deadline = time.monotonic() + timeout_s
        self._ends = await read_ends()
        while True:
            while not self.covers(self._ends):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._ended.is_set():
                    return False
                self._progress.clear()
                await wait_event(self._progress, min(remaining, 1.0))
            newer = await read_ends()
            if self.covers(newer):
                self.done.set()
                return True
            self._ends = newer

    def behind(self) -> dict[int, tuple[int, int]]:
        """partition -> (next offset to read, end offset) of the partitions not read yet."""
        return {p: (self._seen.get(p, 0), end) for p, end in self._ends.items() if self._seen.get(p, 0) < end}

    def end(self) -> None:
        """The router stops: every waiter returns at once."""
        self._ended.set()

    async def wait(self, timeout_s: float) -> bool:
        """True once caught up; False when `timeout_s` passed first (the router goes on with
        what it has read) or the router stops (`end`)."""
        waits = [asyncio.ensure_future(self.done.wait()), asyncio.ensure_future(self._ended.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        return self.done.is_set()
