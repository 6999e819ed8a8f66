"""The producer service: eval.jobs -> validated runs -> eval.shards (intake.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import msgspec
from faststream import AckPolicy
from faststream.kafka.annotations import KafkaMessage

from evalstream.common import db, keys, service, storage, topics
from evalstream.common.contract import JobRejected, decode_job
from evalstream.common.datasets import parts
from evalstream.common.messages import JobSpec
from evalstream.common.metrics import RUNS
from evalstream.common.names import plain_name_problem
from evalstream.common.poison import PoisonGuard, broker_probe, bucket_probe, database_probe
from evalstream.common.settings import ProducerSettings
from evalstream.producer.intake import Intake

log = logging.getLogger("evalstream.producer")
settings = ProducerSettings.from_env()
broker = service.make_broker(settings, "producer")
intake = service.Started[Intake]()


@broker.subscriber(
    topics.JOBS,
    group_id=topics.PRODUCER_GROUP,
    auto_offset_reset="earliest",
    ack_policy=AckPolicy.NACK_ON_ERROR,
    max_poll_interval_ms=30 * 60 * 1000,
)
@service.backoff_on_error(2.0)
async def on_job(msg: KafkaMessage) -> None:
    # a job that keeps failing (not during an outage) is dead-lettered: poison.py
    await guard.run([service.record_of(msg)], take_jobs)


async def take_jobs(records: Sequence[service.Record]) -> None:
    for record in records:
        await take_job(record)


async def take_job(record: service.Record) -> None:
    derived_id = keys.run_id_for_message(record.topic, record.partition, record.offset)
    try:
        job = await service.decode_or_dead_letter(broker, record, JobSpec, decode_job)
    except JobRejected as exc:
        # A JSON object that is not a valid job (a misspelt field, a wrong type): a run
        # recorded as rejected, with the fields named, and nothing published.
        RUNS.labels(outcome=await intake.get().reject_undecodable(exc.run_id or derived_id, exc)).inc()
        return
    if job is None:  # garbage on eval.jobs never stops the producer: it is a dead letter
        RUNS.labels(outcome="undecodable").inc()
        return
    if job.run_id is not None and (problem := plain_name_problem(job.run_id, "run_id")):
        # an id that would become S3 keys: the run is recorded under one derived from the message
        rejected = JobRejected([("run_id", problem)], None, msgspec.to_builtins(job))
        RUNS.labels(outcome=await intake.get().reject_undecodable(derived_id, rejected)).inc()
        return

    async def publish(payload: bytes, key: bytes) -> None:
        await broker.publish(payload, topics.SHARDS, key=key)

    outcome = await intake.get().handle(job, job.run_id or derived_id, publish)
    RUNS.labels(outcome=outcome).inc()


guard = PoisonGuard(
    broker,
    "producer",
    limit=settings.consumer_max_failures,
    probes=[
        database_probe(lambda: intake.get().pool),
        bucket_probe(lambda: intake.get().s3, settings.s3_bucket_datasets),
        broker_probe(broker),
    ],
)


def start_checkers() -> None:
    """The processes that check large datasets, started beside the rest (parts.py)."""
    try:
        parts.start(settings.dataset_check_processes)
    except Exception:  # not fatal: the first large dataset starts them again
        log.warning("the dataset checking processes did not start", exc_info=True)


@asynccontextmanager
async def lifespan() -> AsyncIterator[None]:
    pool = await db.create_pool(settings.database_url)
    intake.set(Intake(settings, pool, storage.client(settings)))
    checkers = asyncio.create_task(asyncio.to_thread(start_checkers))
    try:
        yield
    finally:
        await pool.close()
        checkers.cancel()
        await asyncio.to_thread(parts.close)


app = service.make_app(
    broker, lifespan=lifespan, ready_checks=[service.database_ready(lambda: intake.get().pool)]
)
