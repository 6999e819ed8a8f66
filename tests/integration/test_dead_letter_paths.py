"""Small data-loss paths of issue 14, each on the real stack: results of a run the database
does not know are kept as dead letters (not dropped), and two different dead letters at the
same (partition, offset) - eval.dlq was recreated - are both recorded."""

from __future__ import annotations

import time

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer

from evalstream.aggregator.store import DeadLetterRecord, ResultStore
from evalstream.common import db, topics
from evalstream.common.messages import ItemResult, ShardResult, encode
from evalstream.common.settings import Settings
from tests.support import admin_database_url, service_database_url, unique, wait_until

pytestmark = pytest.mark.stack


async def test_results_of_an_unknown_run_become_a_dead_letter(
    stack: Settings, kafka_producer: AIOKafkaProducer, pg_admin: asyncpg.Connection
) -> None:
    ghost = unique("ghost-run")
    result = ShardResult(
        run_id=ghost,
        shard_id=f"{ghost}-s00000",
        worker_id="w",
        group="g",
        results=[
            ItemResult(run_id=ghost, item_id=f"i{n}", shard_id=f"{ghost}-s00000", response="4", extracted="4",
                       correct=True, score=1.0)
            for n in range(3)
        ],
    )  # fmt: skip
    await kafka_producer.send_and_wait(topics.RESULTS, encode(result), key=ghost.encode())

    async def kept() -> list[asyncpg.Record]:
        return list(
            await pg_admin.fetch(
                "SELECT error, original_topic, payload FROM dead_letters WHERE run_id = $1", ghost
            )
        )

    rows = await wait_until(kept, 120, what=f"a dead letter for the results of unknown run {ghost}")
    assert len(rows) == 1
    assert rows[0]["error"] == f"results of unknown run {ghost}"
    assert rows[0]["original_topic"] == topics.RESULTS
    assert bytes(rows[0]["payload"]) == encode(result)  # every result in it, as published
    assert await pg_admin.fetchval("SELECT count(*) FROM item_results WHERE run_id = $1", ghost) == 0


async def test_dead_letters_at_the_same_offset_of_a_recreated_topic_are_both_kept(
    stack: Settings, pg_admin: asyncpg.Connection
) -> None:
    run_id = unique("dlq-identity")
    now_ms = int(time.time() * 1000)

    def letter(ts: int, error: str) -> DeadLetterRecord:
        return DeadLetterRecord(
            run_id=run_id, item_id="i0", original_topic="eval.shards", original_partition=0, original_offset=7,
            dlq_partition=2, dlq_offset=41, dlq_timestamp=ts, error=error, headers={}, payload=error.encode(),
        )  # fmt: skip

    await db.migrate(admin_database_url())  # the owner's
    pool = await db.create_pool(service_database_url("aggregator"))
    try:
        store = ResultStore(pool)
        for one in (
            letter(now_ms, "before the topic was recreated"),
            letter(now_ms + 60_000, "after: offsets start again"),
            letter(now_ms, "before the topic was recreated"),  # redelivered
        ):
            async with pool.acquire() as conn, conn.transaction():
                await store.write(conn, [], [one])
    finally:
        await pool.close()
    errors = [
        r["error"]
        for r in await pg_admin.fetch("SELECT error FROM dead_letters WHERE run_id = $1 ORDER BY id", run_id)
    ]
    assert errors == ["before the topic was recreated", "after: offsets start again"]
