"""The aggregator service: eval.results and eval.dlq -> PostgreSQL + S3, run completion.

Per batch of messages: one database transaction (store.py), then the touched shards'
Parquet files, their rows in the Delta Lake table and the completion of the runs that have
every result (completion.py); only then are offsets committed. The HTTP pages (report,
item browser, compare) are web.py's.
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
from evalstream.aggregator.completion import Completion, written_results
from evalstream.aggregator.dead_letters import park_unknown_run, read_dead_letters
from evalstream.aggregator.store import ResultStore
from evalstream.common import db, service, storage, telemetry, topics
from evalstream.common.messages import (
    ControlRequest,
    ItemResult,
    Redrive,
    Regrade,
    Shard,
    ShardResult,
    encode,
)
from evalstream.common.settings import AggregatorSettings
from evalstream.common.testhooks import CrashPoints

log = logging.getLogger("evalstream.aggregator")
settings = AggregatorSettings.from_env()
broker = service.make_broker(settings, "aggregator")
crash_points = CrashPoints(settings.fault_inject)


@dataclass
class AggregatorState:
    pool: asyncpg.Pool
    store: ResultStore
    completion: Completion
    s3: Minio


running = service.Started[AggregatorState]()
_consumer: dict[str, Any] = {
    "batch": True,
    "max_records": 200,
    "batch_timeout_ms": 200,
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
    results: list[ItemResult] = []
    for record, payload in delivered:
        if foreign := {r.run_id for r in payload.results} - known:
            await park_unknown_run(broker, record, sorted(foreign)[0])  # kept, not dropped
        else:
            results.extend(payload.results)
    successes = [r for r in results if r.error is None]
    written = await aggregator.store.write(successes, [r for r in results if r.error is not None])
    crash_points.reach("aggregator_exit_after_write")  # test-only (FAULT_INJECT)
    await aggregator.completion.observe(written_results(results, written))
    await aggregator.completion.after_write({(r.run_id, r.shard_id) for r in results})


@broker.subscriber(topics.DLQ, group_id=topics.AGGREGATOR_DLQ_GROUP, **_consumer)
@service.backoff_on_error()
@telemetry.traced_batch(topics.AGGREGATOR_DLQ_GROUP)
async def on_dead_letters(msg: KafkaMessage) -> None:
    """Every dead letter is recorded; one that carries items of a known run becomes their
    failed results, so the run still completes (dead_letters.py)."""
    aggregator = running.get()
    letters, failures = read_dead_letters(service.records_of(msg))
    known = await aggregator.store.known_runs(f.run_id for f in failures)
    failures = [f for f in failures if f.run_id in known]
    written = await aggregator.store.write([], failures, letters)
    await aggregator.completion.observe(written_results(failures, written))
    await aggregator.completion.after_write({(f.run_id, f.shard_id) for f in failures})


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
    request = await service.decode_or_dead_letter(broker, service.record_of(msg), kinds)
    aggregator = running.get()

    async def publish(shard: Shard) -> None:
        await broker.publish(encode(shard), topics.SHARDS, key=shard.run_id.encode())

    if isinstance(request, Redrive):
        await redrive.redrive_run(aggregator.store, request.run_id, publish)
    elif isinstance(request, Regrade):
        await regrade.regrade_run(aggregator.store, aggregator.s3, aggregator.completion, request, publish)


@asynccontextmanager
async def lifespan() -> AsyncIterator[None]:
    pool = await db.create_pool(settings.database_url)
    store = ResultStore(pool)
    table = delta.DeltaMirror(
        delta.DeltaResults(delta.table_uri(settings), delta.storage_options(settings)), store
    )
    s3 = storage.client(settings)
    completion = Completion(store, s3, settings.s3_bucket_results, table, crash_points)
    running.set(AggregatorState(pool=pool, store=store, completion=completion, s3=s3))
    try:
        yield
    finally:
        await pool.close()


app = service.make_app(
    broker,
    lifespan=lifespan,
    ready_checks=[service.database_ready(lambda: running.get().pool)],
    prefix_routes=web.routes(lambda: running.get().pool),  # report, item browser, compare pages
)
