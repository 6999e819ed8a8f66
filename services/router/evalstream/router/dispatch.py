"""What the router does with one shard: wait for a group (back-pressure), forward it to the
group's work topic, park it (parking.py) or dead-letter it as unroutable; and the rescue of
a shard found on a dead group's topic (health.RescueManager)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import msgspec
from aiokafka import TopicPartition
from faststream.kafka import KafkaBroker

from evalstream.common import service, topics
from evalstream.common.messages import Shard, encode
from evalstream.common.metrics import ROUTER_BACKPRESSURE, ROUTER_ROUTED, SHARDS
from evalstream.router.parking import ParkingPolicy
from evalstream.router.routing import Blocked, Placement, Router

log = logging.getLogger("evalstream.router")


class ShuttingDown(Exception):
    """Raised in a waiting handler at shutdown: the shard is not acknowledged, so it is
    redelivered to the next router instead of holding the shutdown up."""


def still_assigned(record: service.Record) -> bool:
    """False when a rebalance took the record's partition away while it waited: its new
    owner routes it (from the committed offset), so this one must not."""
    consumer = getattr(record, "consumer", None)
    return consumer is None or TopicPartition(record.topic, record.partition) in consumer.assignment()


class Dispatcher:
    def __init__(
        self, broker: KafkaBroker, router: Router, parking: ParkingPolicy, retry_topic: str | None
    ) -> None:
        self.broker = broker
        self.router = router
        self.parking = parking
        self.retry_topic = retry_topic
        self.stopping = False  # set at shutdown: waiting handlers give their shards back

    async def route(self, shard: Shard, record: service.Record) -> None:
        await self.hold_until_due(shard)
        wait = self.parking.wait_for(shard, lambda: self.router.fleet.known(shard.model, shard.worker_group))
        placement = await self.place(shard, wait.give_up)
        if isinstance(placement, Placement):
            if still_assigned(record):
                await self.forward(shard, placement, "routed")
        elif wait.unroutable():
            await self.dead_letter_unroutable(shard, record, time.time() - wait.parked_at)
            self.parking.parked(shard)  # the same reason: the next ones need not wait
        elif self.retry_topic and still_assigned(record):
            parked = msgspec.structs.replace(shard, parked_at=wait.parked_at, not_before=wait.not_before())
            await self.broker.publish(encode(parked), self.retry_topic, key=shard.run_id.encode())
            self.parking.parked(shard)
            SHARDS.labels(service="router", outcome="parked").inc()

    async def place(self, shard: Shard, stop: Callable[[Blocked], bool]) -> Placement | Blocked:
        """Waits until the shard has a group, or `stop(reason)` says to stop waiting."""
        waiting = False
        try:
            while True:
                if self.stopping:
                    raise ShuttingDown(shard.shard_id)
                decision = self.router.decide(shard, time.time())
                if isinstance(decision, Placement) or stop(decision):
                    return decision
                if decision is Blocked.SATURATED:
                    self.router.want_lag()
                    if not waiting:
                        ROUTER_BACKPRESSURE.inc()
                        waiting = True
                await self.router.wait_change(0.5)
        finally:
            if waiting:
                ROUTER_BACKPRESSURE.dec()

    async def forward(self, shard: Shard, placement: Placement, reason: str) -> None:
        served = placement.model if placement.model != shard.model else None
        routed = msgspec.structs.replace(shard, routed_to=placement.group, served_model=served)
        await self.broker.publish(
            encode(routed), topics.work_topic(placement.group), key=shard.run_id.encode()
        )
        SHARDS.labels(service="router", outcome=reason).inc()
        ROUTER_ROUTED.labels(
            policy=self.router.config.policy,
            worker_group=placement.group,
            model=placement.model,
            reason=reason,
        ).inc()

    async def hold_until_due(self, shard: Shard) -> None:
        """A retry holds its partition (eval.retry only) until it is due. A parked shard is
        due as soon as a group that serves it is alive again: it waited only for that."""
        while (wait := shard.not_before - time.time()) > 0:
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
            await self.forward(shard, placement, "rerouted")
            return True
        return None if stopping() else False

    async def dead_letter_unroutable(self, shard: Shard, record: service.Record, waited_s: float) -> None:
        where = f"group {shard.worker_group!r}" if shard.worker_group else "any worker group"
        error = f"no healthy worker group serves model {shard.model!r} ({where}) after {waited_s:.0f}s"
        log.warning("shard %s: %s", shard.shard_id, error)
        for item in shard.items:
            one = msgspec.structs.replace(shard, items=[item])
            headers = service.dead_letter_headers(
                record, error, attempts=shard.attempt, run_id=shard.run_id, item_id=item.id
            )
            await service.dead_letter(
                self.broker, encode(one), headers, key=shard.run_id.encode(), reason="unroutable"
            )
        SHARDS.labels(service="router", outcome="unroutable").inc()
