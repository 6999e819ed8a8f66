"""The aggregator's per-run counters are the run's rows by outcome: a success that replaces
a recorded failure (a redrive) moves the item from `failed` to `succeeded`, and a
redelivered result changes nothing. Real PostgreSQL, the aggregator's own store and
completion code, its metrics registry read as Prometheus would."""

from __future__ import annotations

import json

import asyncpg
import pytest
from prometheus_client import REGISTRY

from evalstream.aggregator.completion import Completion, written_results
from evalstream.aggregator.store import ResultStore, Sourced, source_of
from evalstream.common import db, storage
from evalstream.common.messages import ItemResult
from evalstream.common.settings import Settings
from tests.support import principal_settings, unique

pytestmark = pytest.mark.stack


def result(run_id: str, item_id: str, error: str | None = None) -> ItemResult:
    return ItemResult(
        run_id=run_id, item_id=item_id, shard_id=f"{run_id}-s0", response=None if error else "4",
        extracted=None if error else "4", correct=None if error else True, score=0.0 if error else 1.0,
        error=error,
    )  # fmt: skip


def counted(run_id: str) -> dict[str, float | None]:
    return {
        status: REGISTRY.get_sample_value("evalstream_run_items_total", {"run_id": run_id, "status": status})
        for status in ("succeeded", "failed")
    }


async def test_a_redriven_success_moves_its_item_from_failed_to_succeeded(
    stack: Settings, pg_admin: asyncpg.Connection
) -> None:
    run_id = unique("counters")
    await pg_admin.execute(
        "INSERT INTO runs (run_id, status, model, grader, spec, total) VALUES ($1, 'running', 'null', 'exact', $2, 3)",
        run_id,
        json.dumps({}),
    )
    own = principal_settings("aggregator")  # the aggregator's database role and S3 key pair
    pool = await db.create_pool(own.database_url)
    try:
        store = ResultStore(pool)
        completion = Completion(store, storage.client(own), own.s3_bucket_results)
        offset = 0

        async def record(results: list[ItemResult]) -> None:
            nonlocal offset
            offset += 1
            rows = [Sourced(r, source_of("eval.results", 0, offset)) for r in results]
            async with pool.acquire() as conn, conn.transaction():
                written = await store.write(conn, rows)
            await completion.observe(written_results(results, written))

        await record([result(run_id, "a"), result(run_id, "b", "dead-lettered"), result(run_id, "c", "x")])
        assert counted(run_id) == {"succeeded": 1.0, "failed": 2.0}
        await record([result(run_id, "b")])  # the redrive's success replaces b's failure
        assert counted(run_id) == {"succeeded": 2.0, "failed": 1.0}
        await record([result(run_id, "b"), result(run_id, "c", "x")])  # redelivered: no new row
        assert counted(run_id) == {"succeeded": 2.0, "failed": 1.0}
        rows = await pg_admin.fetch("SELECT error IS NULL AS ok FROM item_results WHERE run_id = $1", run_id)
        assert sorted(r["ok"] for r in rows) == [False, True, True]
        assert await pg_admin.fetchval("SELECT recorded FROM runs WHERE run_id = $1", run_id) == 3
    finally:
        await pool.close()
        await pg_admin.execute("DELETE FROM runs WHERE run_id = $1", run_id)
