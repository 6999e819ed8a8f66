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
from typing import Any

import asyncpg
from faststream import AckPolicy
from faststream.kafka.annotations import KafkaMessage

from evalstream.aggregator import delta, web
from evalstream.aggregator.completion import Completion, written_results
from evalstream.aggregator.dead_letters import read_dead_letters
from evalstream.aggregator.store import ResultStore
from evalstream.common import db, service, storage, telemetry, topics
from evalstream.common.messages import ItemResult, ShardResult
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
    results: list[ItemResult] = []
    for record in service.records_of(msg):
        if payload := await service.decode_or_dead_letter(broker, record, ShardResult):
            results.extend(payload.results)
    known = await aggregator.store.known_runs(r.run_id for r in results)
    unknown = [r for r in results if r.run_id not in known]
    if unknown:
        log.warning("dropping %d results of unknown runs, e.g. %s", len(unknown), unknown[0].run_id)
    results = [r for r in results if r.run_id in known]
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


@asynccontextmanager
async def lifespan() -> AsyncIterator[None]:
    pool = await db.create_pool(settings.database_url)
    store = ResultStore(pool)
    table = delta.DeltaMirror(
        delta.DeltaResults(delta.table_uri(settings), delta.storage_options(settings)), pool
    )
    completion = Completion(store, storage.client(settings), settings.s3_bucket_results, table, crash_points)
    running.set(AggregatorState(pool=pool, store=store, completion=completion))
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
