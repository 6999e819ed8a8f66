"""The producer service: eval.jobs -> validated runs -> eval.shards (intake.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from faststream import AckPolicy
from faststream.kafka.annotations import KafkaMessage

from evalstream.common import db, keys, service, storage, topics
from evalstream.common.messages import JobSpec
from evalstream.common.metrics import RUNS
from evalstream.common.settings import ProducerSettings
from evalstream.producer.intake import Intake

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
    record = service.record_of(msg)
    job = await service.decode_or_dead_letter(broker, record, JobSpec)
    if job is None:  # garbage on eval.jobs never stops the producer: it is a dead letter
        RUNS.labels(outcome="undecodable").inc()
        return
    run_id = job.run_id or keys.run_id_for_message(record.topic, record.partition, record.offset)

    async def publish(payload: bytes, key: str) -> None:
        await broker.publish(payload, topics.SHARDS, key=key.encode())

    outcome = await intake.get().handle(job, run_id, publish)
    RUNS.labels(outcome=outcome).inc()


@asynccontextmanager
async def lifespan() -> AsyncIterator[None]:
    pool = await db.create_pool(settings.database_url)
    intake.set(Intake(settings, pool, storage.client(settings)))
    try:
        yield
    finally:
        await pool.close()


app = service.make_app(
    broker, lifespan=lifespan, ready_checks=[service.database_ready(lambda: intake.get().pool)]
)
