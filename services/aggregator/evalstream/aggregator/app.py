"""The aggregator service: eval.results and eval.dlq -> PostgreSQL + S3, run completion.

Per batch of messages: one database transaction, then the touched shards' Parquet files,
then completion of the runs that have every result; only then are offsets committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import msgspec
from faststream import AckPolicy
from faststream.kafka.annotations import KafkaMessage

from evalstream.aggregator import delta, objects, redrive, web
from evalstream.aggregator.store import DeadLetterRecord, ResultStore
from evalstream.common import db, evidence, report_html, service, storage, telemetry, topics
from evalstream.common.messages import DeadLetterHeaders as H
from evalstream.common.messages import ItemResult, Redrive, Shard, ShardResult, decode, encode
from evalstream.common.metrics import (
    ITEMS,
    RUN_ACCURACY,
    RUN_ITEMS,
    RUN_PROGRESS,
    RUN_SCORE,
    RUNS,
    STAGE_LATENCY,
    forget_run,
)
from evalstream.common.reports import summarise
from evalstream.common.settings import Settings

log = logging.getLogger("evalstream.aggregator")
settings = Settings.from_env()
broker = service.make_broker(settings, "aggregator")
state: dict[str, Any] = {}
_consumer = {
    "batch": True,
    "max_records": 200,
    "batch_timeout_ms": 200,
    "auto_offset_reset": "earliest",
    "ack_policy": AckPolicy.NACK_ON_ERROR,
    "max_poll_interval_ms": 30 * 60 * 1000,
}


@broker.subscriber(topics.RESULTS, group_id=topics.AGGREGATOR_GROUP, **_consumer)  # type: ignore[call-overload]
@service.backoff_on_error()
@telemetry.traced_batch(topics.AGGREGATOR_GROUP)
async def on_results(msg: KafkaMessage) -> None:
    records = service.records_of(msg)
    delivered: list[tuple[service.Record, ShardResult]] = []
    for record in records:
        try:
            delivered.append((record, decode(record.value or b"", ShardResult)))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            await service.dead_letter(
                broker, record.value or b"", service.dead_letter_headers(record, exc), key=record.key
            )
    known = await store().known_runs(r.run_id for _, sr in delivered for r in sr.results)
    results: list[ItemResult] = []
    for record, shard_result in delivered:
        foreign = {r.run_id for r in shard_result.results} - known
        if foreign:
            await park_unknown_run(record, sorted(foreign)[0])
        else:
            results.extend(shard_result.results)
    successes = [r for r in results if r.error is None]
    written = await store().write(successes, [r for r in results if r.error is not None])
    crash_point("aggregator_exit_after_write")
    await observe(written_results(results, written))
    await after_write({(r.run_id, r.shard_id) for r in results})


async def park_unknown_run(record: service.Record, run_id: str) -> None:
    """Results of a run the database does not know (deleted, restored from an older
    backup, or never created) are kept as a dead letter, not dropped: `evalctl dlq list`
    shows them, and nothing of them is lost if the run reappears."""
    log.warning(
        "results of unknown run %s dead-lettered (%s:%d@%d)",
        run_id,
        record.topic,
        record.partition,
        record.offset,
    )
    error = f"results of unknown run {run_id}"
    headers = service.dead_letter_headers(record, error, run_id=run_id)
    await service.dead_letter(broker, record.value or b"", headers, key=record.key, reason="unknown_run")


@broker.subscriber(topics.DLQ, group_id=topics.AGGREGATOR_DLQ_GROUP, **_consumer)  # type: ignore[call-overload]
@service.backoff_on_error()
@telemetry.traced_batch(topics.AGGREGATOR_DLQ_GROUP)
async def on_dead_letters(msg: KafkaMessage) -> None:
    """Every dead letter is recorded; one that carries items of a known run becomes their
    failed results, so the run still completes."""
    records = service.records_of(msg)
    letters, failures = [], []
    for record in records:
        headers = {k: (v or b"").decode(errors="replace") for k, v in record.headers}
        shard: Shard | None = None
        # poison from some topic is recorded too, but it belongs to no item
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
            shard = decode(record.value or b"", Shard)
        error = headers.get(H.ERROR, "dead-lettered")
        letters.append(
            DeadLetterRecord(
                run_id=headers.get(H.RUN_ID) or (shard.run_id if shard else None),
                item_id=headers.get(H.ITEM_ID)
                or (shard.items[0].id if shard and len(shard.items) == 1 else None),
                original_topic=headers.get(H.ORIGINAL_TOPIC),
                original_partition=_int(headers.get(H.ORIGINAL_PARTITION)),
                original_offset=_int(headers.get(H.ORIGINAL_OFFSET)),
                dlq_partition=record.partition,
                dlq_offset=record.offset,
                dlq_timestamp=record.timestamp,
                error=error,
                headers=headers,
                payload=record.value or b"",
            )
        )
        if shard is not None:
            attempts = _int(headers.get(H.ATTEMPTS)) or shard.attempt
            failures += [
                ItemResult(
                    run_id=shard.run_id,
                    item_id=item.id,
                    shard_id=shard.shard_id,
                    response=None,
                    extracted=None,
                    correct=None,
                    score=0.0,
                    error=error,
                    attempts=attempts,
                    served_by=f"{shard.routed_to}/{shard.served_model or shard.model}"
                    if shard.routed_to
                    else "",
                    category=item.category,
                    question=evidence.question_of(item),
                    gold=evidence.gold_of(item),
                )
                for item in shard.items
            ]
    known = await store().known_runs(f.run_id for f in failures)
    failures = [f for f in failures if f.run_id in known]
    written = await store().write([], failures, letters)
    await observe(written_results(failures, written))
    await after_write({(f.run_id, f.shard_id) for f in failures})


@broker.subscriber(
    topics.CONTROL,
    group_id=topics.AGGREGATOR_CONTROL_GROUP,
    auto_offset_reset="earliest",
    ack_policy=AckPolicy.NACK_ON_ERROR,
)
@service.backoff_on_error()
async def on_control(msg: KafkaMessage) -> None:
    """Requests from evalctl, which writes no table itself: redrive a run's dead letters."""
    record = service.record_of(msg)
    try:
        request = decode(record.value or b"", Redrive)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        await service.dead_letter(
            broker, record.value or b"", service.dead_letter_headers(record, exc), key=record.key
        )
        return

    async def publish(shard: Shard) -> None:
        await broker.publish(encode(shard), topics.SHARDS, key=shard.run_id.encode())

    await redrive.redrive_run(store(), request.run_id, publish)


# Run-labelled series live this long after their run completed (boards show the finished
# run), then go: run ids are unbounded.
RUN_SERIES_TTL_S = 15 * 60
_run_created: dict[str, float] = {}


def written_results(results: list[ItemResult], written: set[tuple[str, str]]) -> list[ItemResult]:
    """The results whose rows this write made, once per item (a success over a failure):
    metrics count rows, not deliveries, so a redelivered batch is not counted twice."""
    by_item = {
        (r.run_id, r.item_id): r
        for r in sorted(results, key=lambda r: r.error is None)
        if (r.run_id, r.item_id) in written
    }
    return list(by_item.values())


async def observe(results: list[ItemResult]) -> None:
    """Metrics of recorded results: final item outcomes, per-run counts and score, and
    each item's end-to-end latency (its run was created -> its result is recorded)."""
    per_run: dict[str, list[float]] = {}
    for r in results:
        counts = per_run.setdefault(r.run_id, [0, 0, 0.0])  # succeeded, failed, score
        counts[1 if r.error is not None else 0] += 1
        counts[2] += r.score
    failed = sum(c[1] for c in per_run.values())
    ITEMS.labels(service="aggregator", status="succeeded").inc(len(results) - failed)
    ITEMS.labels(service="aggregator", status="failed").inc(failed)
    created = await runs_created(set(per_run))
    now = time.time()
    e2e = STAGE_LATENCY.labels(stage="end_to_end")
    for run_id, (ok, bad, score) in per_run.items():
        RUN_ITEMS.labels(run_id=run_id, status="succeeded").inc(ok)
        RUN_ITEMS.labels(run_id=run_id, status="failed").inc(bad)
        RUN_SCORE.labels(run_id=run_id).inc(score)
        if run_id in created:
            latency = max(0.0, now - created[run_id])
            for _ in range(int(ok + bad)):
                e2e.observe(latency)


async def runs_created(run_ids: set[str]) -> dict[str, float]:
    """Unix creation time of each run (cached: it never changes)."""
    missing = [r for r in run_ids if r not in _run_created]
    if missing:
        rows = await state["pool"].fetch(
            "SELECT run_id, extract(epoch FROM created_at)::float8 AS t FROM runs WHERE run_id = ANY($1::text[])",
            missing,
        )
        _run_created.update({r["run_id"]: r["t"] for r in rows})
        while len(_run_created) > 10_000:
            _run_created.pop(next(iter(_run_created)))
    return {r: _run_created[r] for r in run_ids if r in _run_created}


def crash_point(name: str) -> None:
    """Fault injection (FAULT_INJECT="<name>=N"): die abruptly at the N-th pass, as a
    kill -9 would, to prove that what was written but not committed is redelivered safely."""
    spec = dict(p.split("=", 1) for p in settings.fault_inject.split(",") if "=" in p)
    if name in spec:
        state[name] = state.get(name, 0) + 1
        if state[name] >= int(spec[name]):
            log.warning("fault injection: exiting at %s #%d", name, state[name])
            os._exit(137)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


async def after_write(shards: set[tuple[str, str]]) -> None:
    """Mirror the touched shards to S3, then complete the runs that have every result."""
    s3 = state["s3"]
    # Read and upload under one lock: the results and dead-letter handlers can touch the same
    # shard at once, and the later upload must carry the later rows.
    async with state["mirror_lock"]:
        await mirror(s3, shards)
    for run_id in sorted({r for r, _ in shards}):
        await maybe_complete(run_id)


async def mirror(s3: Any, shards: set[tuple[str, str]]) -> None:
    by_shard = await store().shards_rows(shards)
    # S3 round trips overlap in threads: one batch can touch hundreds of shards.
    await asyncio.gather(
        *(
            asyncio.to_thread(objects.write_shard, s3, settings.s3_bucket_results, run_id, shard_id, rows)
            for (run_id, shard_id), rows in sorted(by_shard.items())
        )
    )
    await state["delta"].write(by_shard)
    crash_point("aggregator_exit_after_delta")


async def maybe_complete(run_id: str) -> None:
    status, total, done = await store().progress(run_id)
    if total:
        RUN_PROGRESS.labels(run_id=run_id).set(done / total)
    # Every item has its row, so every shard was published, even if the producer has not
    # yet marked the run running (fast runs can finish before it does).
    if status == "rejected" or total is None or done < total:
        return
    pool: asyncpg.Pool = state["pool"]
    async with pool.acquire() as conn, conn.transaction():
        first = await conn.fetchval(
            "UPDATE runs SET status = 'completed', completed_at = now(), updated_at = now()"
            " WHERE run_id = $1 AND status <> 'completed' RETURNING true",
            run_id,
        )
        summary = await summarise(conn, run_id)
        await conn.execute(
            "UPDATE runs SET summary = $2 WHERE run_id = $1", run_id, msgspec.json.encode(summary).decode()
        )
    await asyncio.to_thread(objects.write_report, state["s3"], settings.s3_bucket_results, run_id, summary)
    await save_report_html(run_id, summary)
    RUN_ACCURACY.labels(run_id=run_id).set(summary["accuracy"] or 0.0)
    if first:  # one handler completes a run, even when results and dead letters race
        async with state["mirror_lock"]:  # the table has one writer at a time
            await state["delta"].compact(run_id)
        asyncio.get_running_loop().call_later(RUN_SERIES_TTL_S, forget_run, run_id)
        RUNS.labels(outcome="completed").inc()
        log.info("run %s completed: %d items, accuracy %s", run_id, total, summary["accuracy"])


async def save_report_html(run_id: str, summary: dict[str, Any]) -> None:
    """The HTML report beside report.json. Derived data: a failure here is logged, never
    allowed to hold up the batch (the page is also rendered on demand over HTTP)."""
    try:
        page = report_html.render(await report_html.collect(state["pool"], run_id, summary))
        await asyncio.to_thread(
            storage.put_bytes,
            state["s3"],
            settings.s3_bucket_results,
            report_html.object_name(run_id),
            page.encode(),
            "text/html; charset=utf-8",
        )
    except Exception:
        log.exception("run %s: HTML report not saved to S3", run_id)


def store() -> ResultStore:
    store: ResultStore = state["store"]
    return store


@asynccontextmanager
async def lifespan() -> AsyncIterator[None]:
    pool = await db.create_pool(settings.database_url)
    state.update(mirror_lock=asyncio.Lock(), pool=pool, store=ResultStore(pool), s3=storage.client(settings))
    state["delta"] = delta.DeltaMirror(
        delta.DeltaResults(delta.table_uri(settings), delta.storage_options(settings)), pool
    )
    try:
        yield
    finally:
        await pool.close()


async def database_ready() -> bool:
    try:
        return bool(await state["pool"].fetchval("SELECT 1"))
    except Exception:
        return False


app = service.make_app(
    broker,
    lifespan=lifespan,
    ready_checks=[database_ready],
    prefix_routes=web.routes(lambda: state["pool"]),  # report, item browser, compare pages
)
