"""The router service: eval.shards and eval.retry -> eval.work.<group>.

First version: a shard goes to a healthy group that serves its model, the one whose
members report the shortest queue. While no healthy group serves it, the shard waits (the
partition is back-pressured); if no group has *ever* served its model for
ROUTER_NO_GROUP_TIMEOUT_S, its items are dead-lettered so that the run still finishes.
"""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec
from faststream import AckPolicy
from faststream.kafka.annotations import KafkaMessage

from evalstream.common import service, topics
from evalstream.common.messages import Heartbeat, Shard, decode, encode
from evalstream.common.metrics import SHARDS
from evalstream.common.settings import Settings
from evalstream.router.fleet import Fleet, Group

log = logging.getLogger("evalstream.router")
settings = Settings.from_env()
broker = service.make_broker(settings, "router")
fleet = Fleet(heartbeat_timeout_s=settings.router_heartbeat_timeout_s)
NO_GROUP_TIMEOUT_S = settings.router_no_group_timeout_s


def choose(groups: list[Group]) -> Group:
    now = time.time()
    return min(
        groups,
        key=lambda g: (
            sum(m.queue_depth for m in g.live_members(now, fleet.heartbeat_timeout_s))
            / max(1, len(g.live_members(now, fleet.heartbeat_timeout_s))),
            g.name,
        ),
    )


async def route(msg: KafkaMessage) -> None:
    record = service.record_of(msg)
    raw: bytes = record.value or b""
    try:
        shard = decode(raw, Shard)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        await service.dead_letter(broker, raw, service.dead_letter_headers(record, exc), key=record.key)
        SHARDS.labels(service="router", outcome="undecodable").inc()
        return
    wait = shard.not_before - time.time()
    if wait > 0:  # a retry: hold this partition (eval.retry only) until it is due
        await asyncio.sleep(wait)
    deadline = time.monotonic() + NO_GROUP_TIMEOUT_S
    while not (groups := fleet.eligible(shard.model, shard.worker_group)):
        if time.monotonic() > deadline and not fleet.known(shard.model, shard.worker_group):
            await dead_letter_unroutable(shard, record)
            return
        await asyncio.sleep(0.5)
    group = choose(groups)
    routed = msgspec.structs.replace(shard, routed_to=group.name)
    await broker.publish(encode(routed), topics.work_topic(group.name), key=shard.run_id.encode())
    SHARDS.labels(service="router", outcome="routed").inc()


async def dead_letter_unroutable(shard: Shard, record: object) -> None:
    where = f"group {shard.worker_group!r}" if shard.worker_group else "any worker group"
    error = f"no healthy worker group serves model {shard.model!r} ({where}) after {NO_GROUP_TIMEOUT_S:.0f}s"
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


_common = {
    "auto_offset_reset": "earliest",
    "ack_policy": AckPolicy.NACK_ON_ERROR,
    "max_poll_interval_ms": 30 * 60 * 1000,
}
broker.subscriber(topics.SHARDS, group_id=topics.ROUTER_GROUP, **_common)(route)  # type: ignore[call-overload]
broker.subscriber(topics.RETRY, group_id=topics.RETRY_GROUP, **_common)(route)  # type: ignore[call-overload]


# Every router instance reads every heartbeat: no consumer group, from the start of the
# compacted topic, never committing.
@broker.subscriber(topics.HEARTBEATS, auto_offset_reset="earliest")
async def on_heartbeat(msg: KafkaMessage) -> None:
    record = service.record_of(msg)
    if not record.value:
        if record.key:
            fleet.forget(record.key.decode())
        return
    try:
        fleet.observe(decode(record.value, Heartbeat))
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.warning("ignoring undecodable heartbeat: %s", exc)


app = service.make_app(broker)
