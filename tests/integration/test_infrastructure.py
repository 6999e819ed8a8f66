"""The real services of the local stack answer: Kafka, PostgreSQL, the S3 store, Prometheus."""

from __future__ import annotations

import asyncio
import io
import json
import urllib.request
import uuid

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from evalstream.common import storage, topics
from evalstream.common.lag import topic_partitions
from evalstream.common.settings import Settings
from tests.support import PROMETHEUS_URL, admin_database_url, admin_kafka, admin_settings

pytestmark = pytest.mark.stack


async def test_kafka_consumer_group_commits_and_reads_back_offset(stack: Settings) -> None:
    topic, group = f"test.roundtrip.{uuid.uuid4().hex[:8]}", f"test-group-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(**admin_kafka())
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 2, 1)])
        producer = AIOKafkaProducer(**admin_kafka(), acks="all")
        await producer.start()
        try:
            for i in range(5):
                await producer.send_and_wait(topic, f"m{i}".encode(), partition=0)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic,
            **admin_kafka(),
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            seen: list[bytes] = []
            while len(seen) < 5:
                for records in (await consumer.getmany(timeout_ms=5000)).values():
                    seen += [r.value for r in records]
            await consumer.commit()
        finally:
            await consumer.stop()
        assert seen == [f"m{i}".encode() for i in range(5)]
        offsets = await admin.list_consumer_group_offsets(group)
        assert offsets[TopicPartition(topic, 0)].offset == 5
        await admin.delete_topics([topic])
    finally:
        await admin.close()


async def test_pipeline_topics_exist_with_partitions(stack: Settings) -> None:
    consumer = AIOKafkaConsumer(**admin_kafka())
    await consumer.start()
    try:
        for spec in topics.BASE_TOPICS:
            assert len(await topic_partitions(consumer, spec.name)) == spec.partitions, spec.name
    finally:
        await consumer.stop()


async def test_postgres_round_trip_through_migrated_schema(stack: Settings) -> None:
    conn = await asyncpg.connect(admin_database_url())  # the owner: the users' role only reads
    run_id = f"test-{uuid.uuid4().hex[:8]}"
    try:
        versions = [
            r["name"] for r in await conn.fetch("SELECT name FROM schema_migrations ORDER BY version")
        ]
        assert versions[0] == "001_initial.sql"
        await conn.execute(
            "INSERT INTO runs (run_id, status, model, grader, spec) VALUES ($1, 'running', 'null',"
            " 'exact', '{}')",
            run_id,
        )
        insert = (
            "INSERT INTO item_results (run_id, item_id, shard_id, score, ordinal) VALUES ($1, 'a', 's', $2, 0)"
            " ON CONFLICT DO NOTHING"
        )
        await conn.execute(insert, run_id, 1.0)
        await conn.execute(insert, run_id, 0.0)  # the natural key drops the duplicate
        rows = await conn.fetch("SELECT score FROM item_results WHERE run_id = $1", run_id)
        assert [r["score"] for r in rows] == [1.0]
    finally:
        await conn.execute("DELETE FROM runs WHERE run_id = $1", run_id)
        await conn.close()


def test_s3_put_list_get_with_minio_client(stack: Settings) -> None:
    s3 = storage.client(admin_settings())  # the store's admin: users write only their uploads
    name = f"tests/{uuid.uuid4().hex}/hello.json"
    body = json.dumps({"hello": "s3"}).encode()
    s3.put_object(stack.s3_bucket_results, name, io.BytesIO(body), len(body), content_type="application/json")
    listed = [
        o.object_name for o in s3.list_objects(stack.s3_bucket_results, prefix=name.rsplit("/", 1)[0] + "/")
    ]
    assert listed == [name]
    assert storage.get_bytes(s3, stack.s3_bucket_results, name) == body
    s3.remove_object(stack.s3_bucket_results, name)
    assert list(s3.list_objects(stack.s3_bucket_results, prefix=name)) == []


async def test_prometheus_scrapes_every_service_as_up(stack: Settings) -> None:
    async def targets() -> dict[str, str]:
        with urllib.request.urlopen(f"{PROMETHEUS_URL}/api/v1/targets", timeout=5) as r:
            data = json.load(r)["data"]["activeTargets"]
        return {t["labels"].get("service", t["labels"]["job"]): t["health"] for t in data}

    deadline = asyncio.get_running_loop().time() + 30
    health: dict[str, str] = {}
    while asyncio.get_running_loop().time() < deadline:
        health = await targets()
        if all(health.get(s) == "up" for s in ("producer", "router", "aggregator", "worker")):
            break
        await asyncio.sleep(1)
    assert {s: health.get(s) for s in ("producer", "router", "aggregator", "worker")} == dict.fromkeys(
        ("producer", "router", "aggregator", "worker"), "up"
    )
