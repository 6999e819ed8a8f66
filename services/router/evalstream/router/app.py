"""The router service: eval.shards and eval.retry -> eval.work.<group>.

Each shard goes to a healthy worker group that serves its model, chosen by ROUTER_POLICY
(router/policy.py; weighted score by default) from heartbeats and consumer lag
(router/fleet.py, router/health.py). Opted-in runs may be sent to a lighter model while the
requested one violates its SLA (router/sla.py); the shard then carries `served_model`.

Back-pressure: when every eligible group is saturated (outstanding shards ≥ ROUTER_MAX_LAG
per live member) the handler holds its shard and waits, so its partition is not read
further. One consumer per input partition (max_workers), so a saturated model stalls only
the partitions whose head shard needs it, and the router holds at most one shard per
consumer plus aiokafka's bounded prefetch (one fetch per partition): memory stays bounded
however long the queue upstream grows, and the backlog stays in Kafka.

While no healthy group serves a shard's model it waits too, but only ROUTER_PARK_AFTER_S:
then it is parked on the retry topic (tried again a few seconds later), so that one run
pinned to a dead group never stalls the other runs sharing its partition. If no group has
*ever* served its model for ROUTER_NO_GROUP_TIMEOUT_S, or its groups stay dead for
ROUTER_PARK_TIMEOUT_S, its items are dead-lettered so that the run still ends.

ROUTER_SHARDS_TOPIC / ROUTER_RETRY_TOPIC replace the input topics (a benchmark or test
router of its own, next to the stack's, on the same broker); ROUTER_GROUPS limits the worker
groups a router uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec
from aiokafka import TopicPartition
from faststream import AckPolicy
from faststream.kafka.annotations import KafkaMessage

from evalstream.common import service, topics
from evalstream.common.messages import Heartbeat, Shard, decode, encode
from evalstream.common.metrics import ROUTER_BACKPRESSURE, ROUTER_ROUTED, SHARDS
from evalstream.common.settings import Settings
from evalstream.router.health import LagMonitor, RescueManager
from evalstream.router.routing import Blocked, Placement, Router, RouterConfig

log = logging.getLogger("evalstream.router")
settings = Settings.from_env()
config = RouterConfig.from_settings(settings)
broker = service.make_broker(settings, "router")
router = Router(config)
NO_GROUP_TIMEOUT_S = settings.router_no_group_timeout_s
PARK_INTERVAL_S = 5.0  # a parked shard is looked at again after this long at first ...
PARK_INTERVAL_MAX_S = 30.0  # ... and less often the longer its group stays dead (park_interval)
_parking: dict[tuple[str, str | None], float] = {}  # (model, pinned group) -> last parked (monotonic)
SHARDS_TOPIC = settings.router_shards_topic or topics.SHARDS
RETRY_TOPIC = None if settings.router_retry_topic == "none" else settings.router_retry_topic or topics.RETRY
state: dict[str, Any] = {"stopping": False}


class ShuttingDown(Exception):
    """Raised in a waiting handler at shutdown: the shard is not acknowledged, so it is
    redelivered to the next router instead of holding the shutdown up."""


async def place(shard: Shard, stop: Callable[[Blocked], bool]) -> Placement | Blocked:
    """Waits until the shard has a group, or `stop(reason)` says to stop waiting."""
    waiting = False
    try:
        while True:
            if state["stopping"]:
                raise ShuttingDown(shard.shard_id)
            decision = router.decide(shard, time.time())
            if isinstance(decision, Placement) or stop(decision):
                return decision
            if decision is Blocked.SATURATED:
                router.want_lag()
                if not waiting:
                    ROUTER_BACKPRESSURE.inc()
                    waiting = True
            await router.wait_change(0.5)
    finally:
        if waiting:
            ROUTER_BACKPRESSURE.dec()


async def forward(shard: Shard, placement: Placement, reason: str) -> None:
    served = placement.model if placement.model != shard.model else None
    routed = msgspec.structs.replace(shard, routed_to=placement.group, served_model=served)
    await broker.publish(encode(routed), topics.work_topic(placement.group), key=shard.run_id.encode())
    SHARDS.labels(service="router", outcome=reason).inc()
    ROUTER_ROUTED.labels(
        policy=config.policy, worker_group=placement.group, model=placement.model, reason=reason
    ).inc()


def still_assigned(record: service.Record) -> bool:
    """False when a rebalance took the record's partition away while it waited: its new
    owner routes it (from the committed offset), so this one must not."""
    consumer = getattr(record, "consumer", None)
    return consumer is None or TopicPartition(record.topic, record.partition) in consumer.assignment()


async def route(msg: KafkaMessage) -> None:
    record = service.record_of(msg)
    raw: bytes = record.value or b""
    try:
        shard = decode(raw, Shard)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        await service.dead_letter(broker, raw, service.dead_letter_headers(record, exc), key=record.key)
        SHARDS.labels(service="router", outcome="undecodable").inc()
        return
    await hold_until_due(shard)
    parked_at = shard.parked_at or time.time()
    target = (shard.model, shard.worker_group)
    # The first shard of a target with no healthy group waits ROUTER_PARK_AFTER_S (the group
    # may be restarting); the shards behind one that was just parked for the same reason
    # park at once, so that a dead group's backlog leaves the partition at publish speed.
    last_parked = _parking.get(target)
    if last_parked is not None and time.monotonic() - last_parked < PARK_INTERVAL_S:
        park_from = time.monotonic()
    else:
        park_from = time.monotonic() + settings.router_park_after_s

    def give_up(reason: Blocked) -> bool:
        return reason is Blocked.NO_GROUP and (
            time.monotonic() > park_from or (not RETRY_TOPIC and unroutable())
        )

    def unroutable() -> bool:
        waited = time.time() - parked_at
        if router.fleet.known(shard.model, shard.worker_group):
            return waited > settings.router_park_timeout_s
        return waited > NO_GROUP_TIMEOUT_S

    placement = await place(shard, give_up)
    if isinstance(placement, Placement):
        if still_assigned(record):
            await forward(shard, placement, "routed")
    elif unroutable():
        await dead_letter_unroutable(shard, record, time.time() - parked_at)
        _parking[target] = time.monotonic()  # the same reason: the next ones need not wait
    elif RETRY_TOPIC and still_assigned(record):
        parked = msgspec.structs.replace(
            shard, parked_at=parked_at, not_before=time.time() + park_interval(parked_at)
        )
        await broker.publish(encode(parked), RETRY_TOPIC, key=shard.run_id.encode())
        _parking[target] = time.monotonic()
        SHARDS.labels(service="router", outcome="parked").inc()


def park_interval(parked_at: float) -> float:
    """A quarter of the time parked so far, within [PARK_INTERVAL_S, PARK_INTERVAL_MAX_S]: a
    long-dead group's backlog does not churn through eval.retry every few seconds, and a group
    that comes back is noticed at once anyway (hold_until_due)."""
    return min(PARK_INTERVAL_MAX_S, max(PARK_INTERVAL_S, (time.time() - parked_at) / 4))


async def hold_until_due(shard: Shard) -> None:
    """A retry holds its partition (eval.retry only) until it is due. A parked shard is due
    as soon as a group that serves it is alive again: it waited only for that."""
    while (wait := shard.not_before - time.time()) > 0:
        if shard.parked_at and router.fleet.eligible(shard.model, shard.worker_group):
            return
        await router.wait_change(min(wait, 1.0))


async def rescue(shard: Shard | None, record: service.Record, stopping: Callable[[], bool]) -> bool | None:
    """Moves one shard found on a dead group's topic (health.Rescuer)."""
    if shard is None:
        error = "undecodable shard on a dead group's work topic"
        await service.dead_letter(broker, record.value or b"", service.dead_letter_headers(record, error))
        return True
    if shard.worker_group is not None:
        return False  # pinned: it waits for its own group
    try:
        placement = await place(shard, lambda reason: stopping() or reason is Blocked.NO_GROUP)
    except ShuttingDown:
        return None
    if isinstance(placement, Placement):
        await forward(shard, placement, "rerouted")
        return True
    return None if stopping() else False


async def dead_letter_unroutable(shard: Shard, record: object, waited_s: float) -> None:
    where = f"group {shard.worker_group!r}" if shard.worker_group else "any worker group"
    error = f"no healthy worker group serves model {shard.model!r} ({where}) after {waited_s:.0f}s"
    log.warning("shard %s: %s", shard.shard_id, error)
    for item in shard.items:
        one = msgspec.structs.replace(shard, items=[item])
        headers = service.dead_letter_headers(
            record,
            error,
            attempts=shard.attempt,
            run_id=shard.run_id,
            item_id=item.id,
        )
        await service.dead_letter(
            broker, encode(one), headers, key=shard.run_id.encode(), reason="unroutable"
        )
    SHARDS.labels(service="router", outcome="unroutable").inc()


def _input(topic: str, default_topic: str, default_group: str) -> dict[str, Any]:
    """Subscriber arguments for an input topic: one consumer per partition, and a consumer
    group of its own for a replaced topic (it must not share the stack router's group)."""
    partitions = next((t.partitions for t in topics.BASE_TOPICS if t.name == topic), topics.WORK_PARTITIONS)
    return {
        "group_id": default_group if topic == default_topic else f"{topics.ROUTER_GROUP}.{topic}",
        "max_workers": partitions,
        "auto_offset_reset": "earliest",
        "ack_policy": AckPolicy.NACK_ON_ERROR,
        # Waiting for room (back-pressure) is deliberate, not a stuck consumer: don't let
        # aiokafka leave the group over it.
        "max_poll_interval_ms": 24 * 3600 * 1000,
    }


broker.subscriber(SHARDS_TOPIC, **_input(SHARDS_TOPIC, topics.SHARDS, topics.ROUTER_GROUP))(route)
if RETRY_TOPIC:
    broker.subscriber(RETRY_TOPIC, **_input(RETRY_TOPIC, topics.RETRY, topics.RETRY_GROUP))(route)


# Every router instance reads every heartbeat: no consumer group, from the start of the
# compacted topic, never committing.
@broker.subscriber(topics.HEARTBEATS, auto_offset_reset="earliest")
async def on_heartbeat(msg: KafkaMessage) -> None:
    record = service.record_of(msg)
    if not record.value:
        if record.key:
            router.fleet.forget(record.key.decode())
        return
    try:
        router.observe(decode(record.value, Heartbeat))
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        # Dead-lettered like poison anywhere else, then tombstoned so that compaction drops
        # it and a restarted router does not report it again (each router replica reports
        # it once, since every replica reads every heartbeat).
        log.warning("undecodable heartbeat dead-lettered: %s", exc)
        await service.dead_letter(
            broker, record.value, service.dead_letter_headers(record, exc), key=record.key
        )
        if record.key:
            await broker.publish(None, topics.HEARTBEATS, key=record.key)


async def start_background() -> None:
    rescues = RescueManager(router, settings.kafka_bootstrap, settings.router_reroute_after_s, rescue)
    monitor = LagMonitor(router, settings.kafka_bootstrap, settings.router_lag_interval_s)
    state["rescues"] = rescues
    state["monitor"] = asyncio.create_task(monitor.run(after_each=rescues.sync))
    log.info(
        "routing %s (+ %s) with policy %s to groups %s",
        SHARDS_TOPIC,
        RETRY_TOPIC or "no retry topic",
        config.policy,
        config.groups,
    )


async def stop_background() -> None:
    state["stopping"] = True  # waiting handlers give their shards back
    monitor: asyncio.Task[None] | None = state.get("monitor")
    if monitor:
        monitor.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await monitor
    if "rescues" in state:
        await state["rescues"].close()


app = service.make_app(broker, after_startup=[start_background], on_shutdown=[stop_background])
