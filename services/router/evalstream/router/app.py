"""The router service: eval.shards and eval.retry -> eval.work.<group>.

Each shard goes to a healthy worker group that serves its model, chosen by ROUTER_POLICY
(router/policy.py; weighted score by default) from heartbeats and consumer lag
(router/fleet.py, router/health.py). Opted-in runs may be sent to a lighter model while the
requested one violates its SLA (router/sla.py); the shard then carries `served_model`.

Shards of eval.shards arrive in polls (up to ROUTER_BATCH_RECORDS shards, fetched
ROUTER_BATCH_BYTES at a time), each decoded as it is routed, in order within
each partition and forwarded without waiting for each acknowledgement; a poll is committed
once all of it is on the broker. eval.retry is read one record at a time by one consumer per
partition: a retry waits there until it is due, holding only its own partition.

Back-pressure: when every eligible group is saturated (outstanding shards ≥ ROUTER_MAX_LAG
per live member) the handler commits what it forwarded so far and holds the shard, waiting,
so the input is not read further (router/dispatch.py); the router holds at most one poll plus
aiokafka's bounded prefetch: memory stays bounded however long the queue upstream grows,
and the backlog stays in Kafka. Several routers share the input partitions.
A shard that no healthy group serves waits a little, then is parked on the retry topic or,
in the end, dead-lettered (router/parking.py).

ROUTER_SHARDS_TOPIC / ROUTER_RETRY_TOPIC replace the input topics (a benchmark or test
router of its own, next to the stack's, on the same broker); ROUTER_GROUPS limits the worker
groups a router uses.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from faststream import AckPolicy
from faststream.kafka.annotations import KafkaMessage

from evalstream.common import service, telemetry, topics
from evalstream.common.kafka_security import client_kwargs
from evalstream.common.lag import topic_partitions
from evalstream.common.messages import Heartbeat, Shard, decode
from evalstream.common.metrics import SHARDS
from evalstream.common.names import plain_name_problem
from evalstream.common.poison import PoisonGuard, broker_probe
from evalstream.common.settings import RouterSettings
from evalstream.common.tasks import cancel_and_wait
from evalstream.router.dispatch import Dispatcher, ShuttingDown
from evalstream.router.fleet import HeartbeatCatchUp
from evalstream.router.health import LagMonitor, RescueManager
from evalstream.router.parking import ParkingPolicy
from evalstream.router.routing import Router, RouterConfig

log = logging.getLogger("evalstream.router")
settings = RouterSettings.from_env()
broker = service.make_broker(settings, "router")
router = Router(RouterConfig.from_settings(settings))
SHARDS_TOPIC = settings.router_shards_topic or topics.SHARDS
RETRY_TOPIC = None if settings.router_retry_topic == "none" else settings.router_retry_topic or topics.RETRY
parking = ParkingPolicy(
    park_after_s=settings.router_park_after_s,
    park_timeout_s=settings.router_park_timeout_s,
    no_group_timeout_s=settings.router_no_group_timeout_s,
    can_park=RETRY_TOPIC is not None,
)
dispatcher = Dispatcher(broker, router, parking, RETRY_TOPIC)
heartbeats_read = HeartbeatCatchUp()


@dataclass
class Background:
    """The router's background work, started once it consumes."""

    rescues: RescueManager
    monitor: asyncio.Task[None]


background = service.Started[Background]()


def make_route(topic: str) -> Callable[[KafkaMessage], Awaitable[None]]:
    """The handler of one input topic's polls."""

    def assigned(record: service.Record) -> bool:
        """False when a rebalance took the record's partition away while it waited: its new
        owner routes it (from the committed offset), so this one must not."""
        consumer = getattr(record, "consumer", None) or subscribers[topic].consumer
        return consumer is None or TopicPartition(record.topic, record.partition) in consumer.assignment()

    async def commit(offsets: dict[TopicPartition, int]) -> None:
        consumer = subscribers[topic].consumer
        if consumer is not None and inputs[topic].get("batch"):  # one record: committed after it
            await consumer.commit({tp: o for tp, o in offsets.items() if tp in consumer.assignment()})

    async def read_shard(record: service.Record) -> Shard | None:
        shard = await service.decode_or_dead_letter(broker, record, Shard)
        if shard is None:
            SHARDS.labels(service="router", outcome="undecodable").inc()
        return shard

    async def route_records(records: Sequence[service.Record]) -> None:
        # a span per record, continuing its trace: its forward is published inside it
        with telemetry.consume_spans(records, group_of[topic]) as spans:
            # routed on the whole fleet's heartbeats, not on the first ones read (bounded wait)
            await heartbeats_read.wait(settings.router_catch_up_s)
            # each shard decoded just before it is routed, not the whole poll up front: a
            # poll's decoded items take about four times its bytes (256-item shards)
            await dispatcher.route_batch(list(zip(records, spans, strict=True)), read_shard, assigned, commit)

    async def route(msg: KafkaMessage) -> None:
        records = service.records_of(msg) if inputs[topic].get("batch") else (service.record_of(msg),)
        await guard.run(records, route_records)

    return route


# A shard that keeps failing its routing (not while the broker is away, not at a shutdown)
# is dead-lettered after CONSUMER_MAX_FAILURES failures (poison.py).
guard = PoisonGuard(
    broker,
    "router",
    limit=settings.consumer_max_failures,
    probes=[broker_probe(broker)],
    never_counted=(ShuttingDown,),
)


def _input(topic: str, default_topic: str, default_group: str, *, batch: bool) -> dict[str, Any]:
    """Subscriber arguments for an input topic, with a consumer group of its own for a
    replaced topic (it must not share the stack router's group). eval.shards comes in polls
    (many shards, rarely waiting); eval.retry one record at a time, one consumer per
    partition: a retry that waits until it is due holds only its own partition."""
    shape: dict[str, Any] = (
        {
            "batch": True,
            "max_records": settings.router_batch_records,
            "batch_timeout_ms": 100,
            # the broker still returns a partition's first record when it is larger (KIP-74)
            "fetch_max_bytes": settings.router_batch_bytes,
            "max_partition_fetch_bytes": min(1024 * 1024, settings.router_batch_bytes),
        }
        if batch
        else {"max_workers": next((t.partitions for t in topics.BASE_TOPICS if t.name == topic), 3)}
    )
    return {
        "group_id": default_group if topic == default_topic else f"{topics.ROUTER_GROUP}.{topic}",
        **shape,
        "auto_offset_reset": "earliest",
        "ack_policy": AckPolicy.NACK_ON_ERROR,
        # Waiting for room (back-pressure) is deliberate, not a stuck consumer: don't let
        # aiokafka leave the group over it.
        "max_poll_interval_ms": 24 * 3600 * 1000,
    }


inputs = {SHARDS_TOPIC: _input(SHARDS_TOPIC, topics.SHARDS, topics.ROUTER_GROUP, batch=True)}
if RETRY_TOPIC:
    inputs[RETRY_TOPIC] = _input(RETRY_TOPIC, topics.RETRY, topics.RETRY_GROUP, batch=False)
group_of = {topic: str(kw["group_id"]) for topic, kw in inputs.items()}
subscribers = {topic: broker.subscriber(topic, **kw) for topic, kw in inputs.items()}
for _topic, _subscriber in subscribers.items():
    _subscriber(make_route(_topic))


# Every router instance reads every heartbeat: no consumer group, from the start of the
# compacted topic, never committing.
@broker.subscriber(topics.HEARTBEATS, auto_offset_reset="earliest")
async def on_heartbeat(msg: KafkaMessage) -> None:
    record = service.record_of(msg)
    try:
        await observe_heartbeat(record)
    finally:
        heartbeats_read.seen(record.partition, record.offset)


async def observe_heartbeat(record: service.Record) -> None:
    if not record.value:
        if record.key:
            router.fleet.forget(record.key.decode(errors="replace"))
        return
    heartbeat = await service.decode_or_dead_letter(broker, record, Heartbeat, decode_heartbeat)
    if heartbeat is not None:
        router.observe(heartbeat)
    elif record.key:
        # Dead-lettered like poison anywhere else, then tombstoned so that compaction drops
        # it and a restarted router does not report it again (each router replica reports
        # it once, since every replica reads every heartbeat).
        await broker.publish(None, topics.HEARTBEATS, key=record.key)


def decode_heartbeat(raw: bytes) -> Heartbeat:
    """A heartbeat, refused (a dead letter) when its group or worker id is no plain name: a
    group's name becomes a topic name (names.py), so a forged one must not become a group."""
    heartbeat = decode(raw, Heartbeat)
    for what, value in (("group", heartbeat.group), ("worker_id", heartbeat.worker_id)):
        if problem := plain_name_problem(value, what):
            raise ValueError(problem)
    return heartbeat


async def start_background() -> None:
    rescues = RescueManager(router, settings, settings.router_reroute_after_s, dispatcher.rescue)
    monitor = LagMonitor(router, settings, settings.router_lag_interval_s)
    background.set(Background(rescues, asyncio.create_task(watch_fleet(monitor, rescues))))
    log.info(
        "routing %s (+ %s) with policy %s to groups %s",
        SHARDS_TOPIC,
        RETRY_TOPIC or "no retry topic",
        router.config.policy,
        router.config.groups,
    )


async def watch_fleet(monitor: LagMonitor, rescues: RescueManager) -> None:
    """Lag reads and rescues, once the heartbeat topic is read up to its end: a group known
    only from an old heartbeat would look dead and have its shards moved."""
    started = time.monotonic()
    try:
        caught_up = await catch_up_on_heartbeats()
    except Exception:  # Kafka away at the start: the waiters' bound lets the router go on
        log.exception("could not read the heartbeat topic's end offsets")
        caught_up = False
    if caught_up:
        log.info("heartbeats read up to the topic's end in %.1f s", time.monotonic() - started)
    else:
        log.warning(
            "heartbeats not read up to their end (%s) in %.0f s: going on with those read",
            heartbeats_read.behind(),
            settings.router_catch_up_s,
        )
    await monitor.run(after_each=rescues.sync)


async def catch_up_on_heartbeats() -> bool:
    consumer = AIOKafkaConsumer(**client_kwargs(settings), enable_auto_commit=False)
    await consumer.start()
    try:
        tps = await topic_partitions(consumer, topics.HEARTBEATS)

        async def ends() -> dict[int, int]:
            return {tp.partition: offset for tp, offset in (await consumer.end_offsets(tps)).items()}

        return await heartbeats_read.run(ends, settings.router_catch_up_s)
    finally:
        await consumer.stop()


async def stop_background() -> None:
    dispatcher.stopping = True  # waiting handlers give their shards back
    heartbeats_read.end()  # ... those waiting for the heartbeats too
    if background.is_set():  # else stopped before it started
        running = background.get()
        running.rescues.closing = True  # a lag round still under way starts no rescuer now
        await cancel_and_wait(running.monitor, "the lag monitor")
        await running.rescues.close()


app = service.make_app(broker, after_startup=[start_background], on_shutdown=[stop_background])
