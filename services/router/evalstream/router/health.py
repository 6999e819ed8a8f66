"""Consumer lag and dead groups: the router's Kafka-facing background work.

LagMonitor reads every live group's consumer lag (committed vs end offsets of
`evalstream-worker-<group>` on `eval.work.<group>`) every ROUTER_LAG_INTERVAL_S, not per
shard, exports it as CONSUMER_LAG, feeds it to the fleet and re-adapts the policy weights.
While shards wait for room (back-pressure) it reads as soon as asked, up to every
LAG_READ_MIN_S: the room a group made is seen at once, not a whole interval later, which
would cap a router at ROUTER_MAX_LAG shards per member per interval.
Dead groups are read ten times less often, and forgotten an hour after their last heartbeat.

Pending shards of a dead group are not lost:
* while some member lives, Kafka hands the dead members' partitions to the survivors
  (after their session timeout) and they consume them;
* when every member is gone for ROUTER_REROUTE_AFTER_S (beyond the heartbeat timeout), a
  Rescuer joins the group's own consumer group on its work topic, so it takes over exactly
  the offsets the workers left uncommitted, and republishes each shard to a healthy group
  through the normal routing decision (back-pressure included), committing only after the
  broker acknowledged the republished shard. A shard pinned to the dead group, or whose
  model no healthy group serves, stays: its partition is paused there and retried later.
* when the group comes back (a live heartbeat), its Rescuer leaves the consumer group at
  once; the returning workers get every partition and continue from the committed offsets:
  nothing is lost, and a shard moved but not yet committed is at worst done twice, which
  the idempotent sinks absorb. Until then the two share the partitions, each partition
  owned by one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import msgspec
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from evalstream.common import topics
from evalstream.common.kafka_security import client_kwargs
from evalstream.common.lag import LagReader
from evalstream.common.messages import Shard, decode
from evalstream.common.metrics import (
    CONSUMER_LAG,
    ROUTER_GROUP_HEALTHY,
    ROUTER_GROUP_OUTSTANDING,
    ROUTER_LAG_READS,
)
from evalstream.common.settings import KafkaSettings
from evalstream.common.tasks import wait_event
from evalstream.router.fleet import Group
from evalstream.router.routing import Router

log = logging.getLogger("evalstream.router.health")

DEAD_READ_EVERY = 10  # dead groups: one lag read per this many rounds
FORGET_AFTER_S = 3600.0  # dead groups older than this are neither read nor rescued
READ_CONCURRENCY = 4
LAG_READ_MIN_S = 0.05  # on demand (back-pressure), reads are at least this far apart
PAUSED_RETRY_S = 10.0  # a rescuer retries shards it could not place after this long

# (shard, record) -> True once the shard is on a healthy group's topic; False: it cannot
# move now (pinned, or no healthy group serves its model); None: give up, we are stopping.
Move = Callable[[Shard | None, ConsumerRecord[bytes, bytes], Callable[[], bool]], Awaitable[bool | None]]


class LagMonitor:
    def __init__(self, router: Router, kafka: KafkaSettings, interval_s: float) -> None:
        self.router = router
        self.kafka = kafka
        self.interval_s = interval_s
        self.rounds = 0
        self._sem = asyncio.Semaphore(READ_CONCURRENCY)
        self._reader: LagReader | None = None

    def due(self, group: Group, now: float) -> bool:
        fleet = self.router.fleet
        if fleet.is_live(group, now):
            return True
        return now - group.last_seen < FORGET_AFTER_S and self.rounds % DEAD_READ_EVERY == 0

    async def read(self, group: Group) -> None:
        async with self._sem:
            routed_at_read = group.routed
            cgroup, topic = topics.worker_consumer_group(group.name), topics.work_topic(group.name)
            try:
                if self._reader is None:
                    raise ConnectionError("no connection to the broker")
                lag = await self._reader.lag(cgroup, topic)
            except Exception as exc:  # a broker hiccup: keep the last value, try next round
                log.warning("lag of group %s unreadable: %s", group.name, exc)
                await self._reset_reader()  # next round on fresh connections (a restarted broker)
                return
        group.record_lag(sum(lag.values()), routed_at_read, time.time())
        ROUTER_LAG_READS.labels(worker_group=group.name).inc()
        for partition, value in lag.items():
            CONSUMER_LAG.labels(group=cgroup, topic=topic, partition=str(partition)).set(value)

    async def _reset_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            with contextlib.suppress(Exception):
                await reader.close()

    async def refresh(self) -> None:
        now = time.time()
        fleet = self.router.fleet
        due = [g for g in list(fleet.groups.values()) if self.due(g, now)]
        if due and self._reader is None:
            try:
                self._reader = await LagReader(self.kafka).start()
            except Exception as exc:
                log.warning("cannot read consumer lag: %s", exc)
        await asyncio.gather(*(self.read(g) for g in due))
        self.rounds += 1
        now = time.time()
        for g in due:
            ROUTER_GROUP_OUTSTANDING.labels(worker_group=g.name).set(g.outstanding)
            ROUTER_GROUP_HEALTHY.labels(worker_group=g.name).set(
                len(g.live_members(now, fleet.heartbeat_timeout_s))
            )
        self.router.refresh_weights(now)
        self.router.notify()

    async def run(self, after_each: Callable[[], Awaitable[None]] | None = None) -> None:
        try:
            while True:
                try:
                    await self.refresh()
                    if after_each:
                        await after_each()
                except Exception:
                    log.exception("lag refresh failed")
                await self._next_round()
        finally:
            await self._reset_reader()

    async def _next_round(self) -> None:
        """After ROUTER_LAG_INTERVAL_S, or sooner when a waiting shard asks (Router.want_lag)."""
        wanted = self.router.lag_wanted
        wanted.clear()
        await wait_event(wanted, self.interval_s)
        await asyncio.sleep(LAG_READ_MIN_S)


class Rescuer:
    """Moves the pending shards of one dead group to healthy groups (see module doc)."""

    def __init__(self, group: str, kafka: KafkaSettings, move: Move) -> None:
        self.group = group
        self.kafka = kafka
        self.move = move
        self.stopping = False
        self.moved = 0
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"rescue-{self.group}")

    async def stop(self) -> None:
        """Finishes the shard in hand (no cancellation between publish and commit), leaves."""
        self.stopping = True
        if self.task:
            with contextlib.suppress(Exception):
                await self.task

    async def _run(self) -> None:
        consumer = AIOKafkaConsumer(
            topics.work_topic(self.group),
            **client_kwargs(self.kafka),
            group_id=topics.worker_consumer_group(self.group),
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=10_000,
            heartbeat_interval_ms=1_000,
            max_poll_interval_ms=24 * 3600 * 1000,  # waiting for room is not being stuck
        )
        await consumer.start()
        log.info("group %s is dead: moving its pending shards to healthy groups", self.group)
        paused: dict[TopicPartition, float] = {}
        try:
            while not self.stopping:
                now = time.monotonic()
                retry = [tp for tp, since in paused.items() if now - since >= PAUSED_RETRY_S]
                if retry:
                    consumer.resume(*retry)
                    for tp in retry:
                        del paused[tp]
                batch = await consumer.getmany(timeout_ms=500, max_records=50)
                for tp, records in batch.items():
                    for record in records:
                        done = await self._move_one(record)
                        if done is None:
                            return
                        if not done:  # leave it (and what follows) where it is
                            consumer.seek(tp, record.offset)
                            consumer.pause(tp)
                            paused[tp] = time.monotonic()
                            break
                        await consumer.commit({tp: record.offset + 1})
        except Exception:
            log.exception("rescuer of group %s failed", self.group)
        finally:
            await consumer.stop()
            log.info("rescuer of group %s stopped after moving %d shards", self.group, self.moved)

    async def _move_one(self, record: ConsumerRecord[bytes, bytes]) -> bool | None:
        try:
            shard: Shard | None = decode(record.value or b"", Shard)
        except (msgspec.DecodeError, msgspec.ValidationError):
            shard = None  # the mover dead-letters it, as the worker would have
        done = await self.move(shard, record, lambda: self.stopping)
        self.moved += bool(done)
        return done


class RescueManager:
    """Keeps one Rescuer per group that is dead, has pending shards and is still remembered."""

    def __init__(self, router: Router, kafka: KafkaSettings, reroute_after_s: float, move: Move) -> None:
        self.router = router
        self.kafka = kafka
        self.reroute_after_s = reroute_after_s
        self.move = move
        self.rescuers: dict[str, Rescuer] = {}
        self.closing = False  # the router stops: no new rescuer

    def wanted(self, group: Group, now: float) -> bool:
        dead_for = self.router.fleet.dead_for(group, now)
        return (
            self.reroute_after_s > 0
            and dead_for is not None
            and dead_for >= self.reroute_after_s
            and now - group.last_seen < FORGET_AFTER_S
            and group.lag > 0
        )

    async def sync(self) -> None:
        now = time.time()
        groups = self.router.fleet.groups
        for name, rescuer in list(self.rescuers.items()):
            group = groups.get(name)
            if group is None or self.router.fleet.dead_for(group, now) is None:
                log.info("group %s is back: its rescuer leaves", name)
                del self.rescuers[name]
                await rescuer.stop()
            elif group.lag == 0 or now - group.last_seen >= FORGET_AFTER_S:
                del self.rescuers[name]  # nothing left to move (or given up on)
                await rescuer.stop()
            elif rescuer.task is not None and rescuer.task.done():
                del self.rescuers[name]  # crashed or gave up: a later round starts another
        for name, group in list(groups.items()):
            if not self.closing and name not in self.rescuers and self.wanted(group, now):
                self.rescuers[name] = Rescuer(name, self.kafka, self.move)
                self.rescuers[name].start()

    async def close(self) -> None:
        self.closing = True
        await asyncio.gather(*(r.stop() for r in self.rescuers.values()))
        self.rescuers.clear()
