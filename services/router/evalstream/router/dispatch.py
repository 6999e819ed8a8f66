"""What the router does with a poll of shards: for each, wait for a group (back-pressure),
forward it to the group's work topic, park it (parking.py) or dead-letter it as unroutable;
and the rescue of a shard found on a dead group's topic (health.RescueManager).

A poll is routed as a batch: forwards are sent without waiting for each acknowledgement, and
the poll's offsets are committed once every one is on the broker (the subscriber commits
after the handler). Before a shard waits for room (back-pressure), what was forwarded so far
is made durable and committed up to that shard (`Batch.settle`): the backlog behind it stays
in Kafka, uncommitted, and a router that dies while waiting hands over only what it did not
forward."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import nullcontext

import msgspec
from aiokafka import TopicPartition
from faststream.kafka import KafkaBroker
from opentelemetry import trace
from opentelemetry.trace import Span

from evalstream.common import service, topics
from evalstream.common.messages import Shard, encode
from evalstream.common.metrics import ROUTER_BACKPRESSURE, ROUTER_ROUTED, SHARDS
from evalstream.common.names import plain_name_problem
from evalstream.common.spread import shard_key_of
from evalstream.router.parking import ParkingPolicy
from evalstream.router.routing import Blocked, Placement, Router

log = logging.getLogger("evalstream.router")
MAX_HOLD_S = 600.0  # RetryPolicy's longest delay (messages.RetryPolicy.problems)


class ShuttingDown(Exception):
    """Raised in a waiting handler at shutdown: the shard is not acknowledged, so it is
    redelivered to the next router instead of holding the shutdown up."""


def still_assigned(record: service.Record) -> bool:
    """False when a rebalance took the record's partition away while it waited: its new
    owner routes it (from the committed offset), so this one must not."""
    consumer = getattr(record, "consumer", None)
    return consumer is None or TopicPartition(record.topic, record.partition) in consumer.assignment()


Commit = Callable[[dict[TopicPartition, int]], Awaitable[None]]


class Batch:
    """One poll's forwards in flight, and what of the poll they cover."""

    def __init__(self, commit: Commit | None) -> None:
        self.commit = commit
        self.sends: list[Awaitable[object]] = []
        self.done: dict[TopicPartition, int] = {}  # next offset to commit, by partition

    async def settle(self) -> None:
        """Every forward so far on the broker, and their records committed."""
        sends, self.sends = self.sends, []
        await asyncio.gather(*sends)
        if self.commit is not None and self.done:
            await self.commit(dict(self.done))

    def finished(self, record: service.Record) -> None:
        self.done[TopicPartition(record.topic, record.partition)] = record.offset + 1


class Dispatcher:
    def __init__(
        self, broker: KafkaBroker, router: Router, parking: ParkingPolicy, retry_topic: str | None
    ) -> None:
        self.broker = broker
        self.router = router
        self.parking = parking
        self.retry_topic = retry_topic
        self.stopping = False  # set at shutdown: waiting handlers give their shards back

    async def route_batch(
        self,
        records: Sequence[tuple[service.Record, Span | None]],
        read: Callable[[service.Record], Awaitable[Shard | None]],
        assigned: Callable[[service.Record], bool],
        commit: Commit | None,
    ) -> None:
        """Routes a poll's records, each inside its record's span (its forward carries the
        trace on), in order within each partition and the partitions side by side: a shard
        that waits (back-pressure, a retry not yet due, a group away) holds only its own
        partition. Each record is decoded (`read`; None: dead-lettered) just before it is
        routed, so that a poll holds one decoded shard per partition, not all of them.
        Returns once every forward is on the broker."""
        batch = Batch(commit)
        by_partition: dict[tuple[str, int], list[tuple[service.Record, Span | None]]] = {}
        for entry in records:
            by_partition.setdefault((entry[0].topic, entry[0].partition), []).append(entry)

        async def in_order(entries: list[tuple[service.Record, Span | None]]) -> None:
            for record, span in entries:
                with trace.use_span(span, end_on_exit=False) if span is not None else nullcontext():
                    shard = await read(record)
                    if shard is not None:
                        await self.route(shard, record, batch, assigned)
                batch.finished(record)

        try:
            async with asyncio.TaskGroup() as partitions:
                for entries in by_partition.values():
                    partitions.create_task(in_order(entries))
        except BaseExceptionGroup as failed:
            raise _first(failed) from None  # the handler's callers know plain exceptions
        await asyncio.gather(*batch.sends)

    async def route(
        self,
        shard: Shard,
        record: service.Record,
        batch: Batch,
        assigned: Callable[[service.Record], bool] = still_assigned,
    ) -> None:
        if shard.worker_group is not None and (
            problem := plain_name_problem(shard.worker_group, "worker_group")
        ):
            await self.dead_letter_unroutable(shard, record, 0.0, problem)  # no group can ever be it
            return
        if shard.not_before > time.time():
            await batch.settle()
            await self.hold_until_due(shard, record.timestamp / 1000)
        wait = self.parking.wait_for(shard, lambda: self.router.fleet.known(shard.model, shard.worker_group))
        placement = await self.place(shard, wait.give_up, before_waiting=batch.settle)
        if isinstance(placement, Placement):
            if assigned(record):
                batch.sends.append(await self.forward(shard, placement, "routed"))
        elif wait.unroutable():
            await self.dead_letter_unroutable(shard, record, time.time() - wait.parked_at)
            self.parking.parked(shard)  # the same reason: the next ones need not wait
        elif self.retry_topic and assigned(record):
            parked = msgspec.structs.replace(shard, parked_at=wait.parked_at, not_before=wait.not_before())
            await self.broker.publish(encode(parked), self.retry_topic, key=shard_key_of(shard))
            self.parking.parked(shard)
            SHARDS.labels(service="router", outcome="parked").inc()

    async def place(
        self,
        shard: Shard,
        stop: Callable[[Blocked], bool],
        before_waiting: Callable[[], Awaitable[None]] | None = None,
    ) -> Placement | Blocked:
        """Waits until the shard has a group, or `stop(reason)` says to stop waiting;
        `before_waiting` runs once, before the first wait."""
        waiting = False
        settled = False
        try:
            while True:
                if self.stopping:
                    raise ShuttingDown(shard.shard_id)
                decision = self.router.decide(shard, time.time())
                if isinstance(decision, Placement) or stop(decision):
                    return decision
                if before_waiting is not None and not settled:
                    settled = True
                    await before_waiting()
                if decision is Blocked.SATURATED:
                    self.router.want_lag()
                    if not waiting:
                        ROUTER_BACKPRESSURE.inc()
                        waiting = True
                await self.router.wait_change(0.5)
        finally:
            if waiting:
                ROUTER_BACKPRESSURE.dec()

    async def forward(self, shard: Shard, placement: Placement, reason: str) -> Awaitable[object]:
        """Queues the shard for its group's topic; returns its acknowledgement to await (a
        poll's forwards are awaited together)."""
        served = placement.model if placement.model != shard.model else None
        routed = msgspec.structs.replace(shard, routed_to=placement.group, served_model=served)
        acknowledged: Awaitable[object] = await self.broker.publish(
            encode(routed), topics.work_topic(placement.group), key=shard_key_of(shard), no_confirm=True
        )
        SHARDS.labels(service="router", outcome=reason).inc()
        ROUTER_ROUTED.labels(
            policy=self.router.config.policy,
            worker_group=placement.group,
            model=placement.model,
            reason=reason,
        ).inc()
        return acknowledged

    async def hold_until_due(self, shard: Shard, published_at: float | None = None) -> None:
        """A retry holds its partition (eval.retry only) until it is due. A parked shard is
        due as soon as a group that serves it is alive again: it waited only for that. A
        message cannot choose how long the router waits: no shard is held past its retry
        policy's longest delay (at most 600 s) plus the longest parking interval after it
        was published, whatever its not_before says."""
        longest = min(MAX_HOLD_S, max(0.0, shard.retry.max_delay_s)) + self.parking.interval_max_s
        start = published_at if published_at is not None else time.time()
        due = min(shard.not_before, start + longest)
        while (wait := due - time.time()) > 0:
            if shard.parked_at and self.router.fleet.eligible(shard.model, shard.worker_group):
                return
            await self.router.wait_change(min(wait, 1.0))

    async def rescue(
        self, shard: Shard | None, record: service.Record, stopping: Callable[[], bool]
    ) -> bool | None:
        """Moves one shard found on a dead group's topic (health.RescueManager)."""
        if shard is None:
            error = "undecodable shard on a dead group's work topic"
            await service.dead_letter(
                self.broker, record.value or b"", service.dead_letter_headers(record, error)
            )
            return True
        if shard.worker_group is not None:
            return False  # pinned: it waits for its own group
        try:
            placement = await self.place(shard, lambda reason: stopping() or reason is Blocked.NO_GROUP)
        except ShuttingDown:
            return None
        if isinstance(placement, Placement):
            await (await self.forward(shard, placement, "rerouted"))
            return True
        return None if stopping() else False

    async def dead_letter_unroutable(
        self, shard: Shard, record: service.Record, waited_s: float, why: str | None = None
    ) -> None:
        where = f"group {shard.worker_group!r}" if shard.worker_group else "any worker group"
        error = why or f"no healthy worker group serves model {shard.model!r} ({where}) after {waited_s:.0f}s"
        log.warning("shard %s: %s", shard.shard_id, error)
        for item in shard.items:
            one = msgspec.structs.replace(shard, items=[item])
            headers = service.dead_letter_headers(
                record, error, attempts=shard.attempt, run_id=shard.run_id, item_id=item.id
            )
            await service.dead_letter(
                self.broker, encode(one), headers, key=shard_key_of(shard), reason="unroutable"
            )
        SHARDS.labels(service="router", outcome="unroutable").inc()


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first exception of a (possibly nested) group."""
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first
