"""The producer service: eval.jobs -> validated runs -> eval.shards."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
from faststream import AckPolicy
from faststream.kafka.annotations import KafkaMessage

from evalstream.common import db, intake_limits, keys, service, storage, topics
from evalstream.common.contract import JobRejected, decode_job
from evalstream.common.metrics import RUNS
from evalstream.common.settings import Settings
from evalstream.producer.intake import Intake

log = logging.getLogger("evalstream.producer")
settings = Settings.from_env()
broker = service.make_broker(settings, "producer")
state: dict[str, Intake] = {}


@broker.subscriber(
    topics.JOBS,
    group_id=topics.PRODUCER_GROUP,
    auto_offset_reset="earliest",
    ack_policy=AckPolicy.NACK_ON_ERROR,
    max_poll_interval_ms=30 * 60 * 1000,
)
@service.backoff_on_error(2.0)
async def on_job(msg: KafkaMessage) -> None:
    record = service.record_of(msg)
    raw: bytes = record.value or b""
    try:
        job = decode_job(raw)
    except JobRejected as exc:
        # A JSON object that is not a valid job (a misspelt field, a wrong type): a run
        # recorded as rejected, with the fields named, and nothing published.
        run_id = exc.run_id or keys.run_id_for_message(record.topic, record.partition, record.offset)
        RUNS.labels(outcome=await state["intake"].reject_undecodable(run_id, exc)).inc()
        return
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        # Garbage on eval.jobs never stops the producer: it becomes a dead letter.
        log.warning("undecodable job at %s[%d]@%d: %s", record.topic, record.partition, record.offset, exc)
        await service.dead_letter(broker, raw, service.dead_letter_headers(record, exc), key=record.key)
        RUNS.labels(outcome="undecodable").inc()
        return
    if job.run_id is not None and (problem := intake_limits.plain_name_problem(job.run_id, "run_id")):
        # an id that would become S3 keys: the run is recorded under one derived from the message
        rejected = JobRejected([("run_id", problem)], None, msgspec.to_builtins(job))
        run_id = keys.run_id_for_message(record.topic, record.partition, record.offset)
        RUNS.labels(outcome=await state["intake"].reject_undecodable(run_id, rejected)).inc()
        return
    run_id = job.run_id or keys.run_id_for_message(record.topic, record.partition, record.offset)

    async def publish(payload: bytes, key: str) -> None:
        await broker.publish(payload, topics.SHARDS, key=key.encode())

    outcome = await state["intake"].handle(job, run_id, publish)
    RUNS.labels(outcome=outcome).inc()


@asynccontextmanager
async def lifespan() -> AsyncIterator[None]:
    pool = await db.create_pool(settings.database_url)
    state["intake"] = Intake(settings, pool, storage.client(settings))
    try:
        yield
    finally:
        await pool.close()


async def database_ready() -> bool:
    try:
        return bool(await state["intake"].pool.fetchval("SELECT 1"))
    except Exception:
        return False


app = service.make_app(broker, lifespan=lifespan, ready_checks=[database_ready])
