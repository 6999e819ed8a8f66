"""The aggregator service: eval.results and eval.dlq -> PostgreSQL + S3, run completion.

Each handler turns one window of records (a poll: AGGREGATOR_WINDOW_*) into a sink.Window and
hands it to the sink (sink.py): one database transaction, the Parquet segments and one Delta
commit, the completion of the runs it finished; only then are offsets committed. Several
aggregators share the topics' partitions. The HTTP pages (report, item browser, compare) are
web.py's.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, cast

import asyncpg
from faststream import AckPolicy
from faststream.kafka.annotations import KafkaMessage
from minio import Minio

from evalstream.aggregator import delta, redrive, regrade, web
from evalstream.aggregator.completion import Completion
from evalstream.aggregator.dead_letters import park_unknown_run, read_dead_letters
from evalstream.aggregator.sink import ResultSink, SinkLock, Window
from evalstream.aggregator.store import ResultStore, Sourced, source_of
from evalstream.common import db, service, storage, telemetry, topics
from evalstream.common.messages import (
    ControlRequest,
    Redrive,
    Regrade,
    Shard,
    ShardResult,
    encode,
)
from evalstream.common.settings import AggregatorSettings
from evalstream.common.spread import shard_key_of
from evalstream.common.testhooks import CrashPoints

log = logging.getLogger("evalstream.aggregator")
settings = AggregatorSettings.from_env()
broker = service.make_broker(settings, "aggregator")
crash_points = CrashPoints(settings.fault_inject)


@dataclass
class AggregatorState:
    pool: asyncpg.Pool
    store: ResultStore
    sink: ResultSink
    s3: Minio


running = service.Started[AggregatorState]()
_consumer: dict[str, Any] = {
    "batch": True,
    "max_records": settings.aggregator_window_records,
    "batch_timeout_ms": settings.aggregator_window_ms,
    # The window's bounds, kept by the broker: a fetch returns once this many bytes are
    # there or the time is up, so a fast stream makes large windows and a slow one is
    # still written within the time bound.
    "fetch_min_bytes": settings.aggregator_window_bytes,
    "fetch_max_wait_ms": settings.aggregator_window_ms,
    "max_partition_fetch_bytes": settings.aggregator_window_bytes,
    "auto_offset_reset": "earliest",
    "ack_policy": AckPolicy.NACK_ON_ERROR,
    "max_poll_interval_ms": 30 * 60 * 1000,
}


@broker.subscriber(topics.RESULTS, group_id=topics.AGGREGATOR_GROUP, **_consumer)
@service.backoff_on_error()
@telemetry.traced_batch(topics.AGGREGATOR_GROUP)
async def on_results(msg: KafkaMessage) -> None:
    aggregator = running.get()
    delivered: list[tuple[service.Record, ShardResult]] = []
    for record in service.records_of(msg):
        if payload := await service.decode_or_dead_letter(broker, record, ShardResult):
            delivered.append((record, payload))
    known = await aggregator.store.known_runs(r.run_id for _, p in delivered for r in p.results)
    results: list[Sourced] = []
    for record, payload in delivered:
        if foreign := {r.run_id for r in payload.results} - known:
            await park_unknown_run(broker, record, sorted(foreign)[0])  # kept, not dropped
        else:
            source = source_of(record.topic, record.partition, record.offset)
            results.extend(Sourced(r, source) for r in payload.results)
    await aggregator.sink.record(Window(results))


@broker.subscriber(topics.DLQ, group_id=topics.AGGREGATOR_DLQ_GROUP, **_consumer)
@service.backoff_on_error()
@telemetry.traced_batch(topics.AGGREGATOR_DLQ_GROUP)
async def on_dead_letters(msg: KafkaMessage) -> None:
    """Every dead letter is recorded; one that carries items of a known run becomes their
    failed results, so the run still completes (dead_letters.py)."""
    aggregator = running.get()
    letters, failures = read_dead_letters(service.records_of(msg))
    known = await aggregator.store.known_runs(f.result.run_id for f in failures)
    await aggregator.sink.record(Window([f for f in failures if f.result.run_id in known], letters))


@broker.subscriber(
    topics.CONTROL,
    group_id=topics.AGGREGATOR_CONTROL_GROUP,
    auto_offset_reset="earliest",
    ack_policy=AckPolicy.NACK_ON_ERROR,
)
@service.backoff_on_error()
async def on_control(msg: KafkaMessage) -> None:
    """Requests from evalctl, which writes no table itself: redrive a run's dead letters
    (redrive.py), regrade a run (regrade.py)."""
    kinds = cast("type[ControlRequest]", ControlRequest)  # a union, told apart by `kind`
    record = service.record_of(msg)
    request = await service.decode_or_dead_letter(broker, record, kinds)
    aggregator = running.get()

    async def publish(shard: Shard) -> None:
        await broker.publish(encode(shard), topics.SHARDS, key=shard_key_of(shard))

    if isinstance(request, Redrive):
        await redrive.redrive_run(aggregator.store, request.run_id, publish)
    elif isinstance(request, Regrade):
        source = source_of(record.topic, record.partition, record.offset)
        await regrade.regrade_run(aggregator.store, aggregator.s3, aggregator.sink, request, source, publish)


@asynccontextmanager
async def lifespan() -> AsyncIterator[None]:
    pool = await db.create_pool(settings.database_url)
    store = ResultStore(pool)
    table = delta.DeltaMirror(
        delta.DeltaResults(delta.table_uri(settings), delta.storage_options(settings)), store
    )
    s3 = storage.client(settings)
    lock = SinkLock(settings.database_url)
    completion = Completion(store, s3, settings.s3_bucket_results)
    sink = ResultSink(pool, lock, store, s3, settings.s3_bucket_results, table, completion, crash_points)
    running.set(AggregatorState(pool=pool, store=store, sink=sink, s3=s3))
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
