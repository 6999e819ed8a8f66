"""The aggregator service: eval.results and eval.dlq -> PostgreSQL + S3, run completion.

Each handler hands one window of records (a poll: AGGREGATOR_WINDOW_*) to consume.py, which
makes it a sink.Window for the sink (sink.py): one database transaction, the Parquet segments
and one Delta commit, the completion of the runs it finished; only then are offsets
committed. A record that keeps failing costs one dead letter (poison.py). Several aggregators
share the topics' partitions. The HTTP pages (report, item browser, compare) are web.py's.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from faststream import AckPolicy
from faststream.kafka.annotations import KafkaMessage

from evalstream.aggregator import delta, web
from evalstream.aggregator.completion import Completion
from evalstream.aggregator.consume import Aggregator
from evalstream.aggregator.sink import ResultSink, SinkLock
from evalstream.aggregator.store import ResultStore
from evalstream.common import db, service, storage, telemetry, topics
from evalstream.common.poison import PoisonGuard, broker_probe, bucket_probe, database_probe
from evalstream.common.settings import AggregatorSettings
from evalstream.common.testhooks import CrashPoints

log = logging.getLogger("evalstream.aggregator")
settings = AggregatorSettings.from_env()
broker = service.make_broker(settings, "aggregator")
crash_points = CrashPoints(settings.fault_inject)
running = service.Started[Aggregator]()
_consumer: dict[str, Any] = {
    "batch": True,
    "max_records": settings.aggregator_window_records,
    "batch_timeout_ms": settings.aggregator_window_ms,
    # The window's bounds, kept by the broker: a fetch returns once this many bytes are
    # there or the time is up, so a fast stream makes large windows and a slow one is
    # still written within the time bound.
    "fetch_min_bytes": settings.aggregator_window_bytes // 2,
    "fetch_max_wait_ms": settings.aggregator_window_ms,
    "fetch_max_bytes": settings.aggregator_window_bytes,
    "max_partition_fetch_bytes": max(1024 * 1024, settings.aggregator_window_bytes // 4),
    "auto_offset_reset": "earliest",
    "ack_policy": AckPolicy.NACK_ON_ERROR,
    "max_poll_interval_ms": 30 * 60 * 1000,
}


def guard(name: str, **kw: Any) -> PoisonGuard:
    """A record that keeps failing (not during an outage of PostgreSQL, S3 or Kafka) is
    dead-lettered after CONSUMER_MAX_FAILURES failures (poison.py)."""
    probes = [
        database_probe(lambda: running.get().pool),
        bucket_probe(lambda: running.get().s3, settings.s3_bucket_results),
        broker_probe(broker),
    ]
    return PoisonGuard(broker, name, limit=settings.consumer_max_failures, probes=probes, **kw)


async def skip_dead_letter(record: service.Record, why: str) -> None:
    """A dead letter that cannot be recorded stays on eval.dlq (putting it back there would
    loop); its coordinates and the reason are logged and counted."""
    log.error("dead letter %s[%d]@%d not recorded: %s", record.topic, record.partition, record.offset, why)


results_guard = guard("aggregator-results")
dead_letters_guard = guard("aggregator-dlq", discard=skip_dead_letter)
control_guard = guard("aggregator-control")


@broker.subscriber(topics.RESULTS, group_id=topics.AGGREGATOR_GROUP, **_consumer)
@service.backoff_on_error()
@telemetry.traced_batch(topics.AGGREGATOR_GROUP)
async def on_results(msg: KafkaMessage) -> None:
    await results_guard.run(service.records_of(msg), running.get().results)


@broker.subscriber(topics.DLQ, group_id=topics.AGGREGATOR_DLQ_GROUP, **_consumer)
@service.backoff_on_error()
@telemetry.traced_batch(topics.AGGREGATOR_DLQ_GROUP)
async def on_dead_letters(msg: KafkaMessage) -> None:
    await dead_letters_guard.run(service.records_of(msg), running.get().dead_letters)


@broker.subscriber(
    topics.CONTROL,
    group_id=topics.AGGREGATOR_CONTROL_GROUP,
    auto_offset_reset="earliest",
    ack_policy=AckPolicy.NACK_ON_ERROR,
)
@service.backoff_on_error()
async def on_control(msg: KafkaMessage) -> None:
    await control_guard.run([service.record_of(msg)], running.get().control)


@asynccontextmanager
async def lifespan() -> AsyncIterator[None]:
    pool = await db.create_pool(settings.database_url)
    store = ResultStore(pool)
    table = delta.DeltaMirror(
        delta.DeltaResults(delta.table_uri(settings), delta.storage_options(settings)),
        store,
        maintenance_s=settings.aggregator_delta_maintenance_s,
    )
    s3 = storage.client(settings)
    lock = SinkLock(settings.database_url)
    completion = Completion(store, s3, settings.s3_bucket_results)
    sink = ResultSink(pool, lock, store, s3, settings.s3_bucket_results, table, completion, crash_points)
    running.set(Aggregator(broker, pool, store, sink, s3))
    try:
        yield
    finally:
        await lock.close()
        await pool.close()


app = service.make_app(
    broker,
    lifespan=lifespan,
    ready_checks=[service.database_ready(lambda: running.get().pool)],
    prefix_routes=web.routes(lambda: running.get().pool),  # report, item browser, compare pages
)
